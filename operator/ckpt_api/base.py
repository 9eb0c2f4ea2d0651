"""Pydantic base shared by every API model: camelCase on the wire, unknown fields rejected."""

from pydantic import BaseModel, ConfigDict, JsonValue
from pydantic.alias_generators import to_camel

_BASE_CONFIG = ConfigDict(
    alias_generator=to_camel,
    populate_by_name=True,
    extra="forbid",
    validate_default=True,
)


def config_with_rules(*rules: dict[str, str]) -> ConfigDict:
    """The base config plus CEL rules the CRD attaches to the model's object schema."""
    validations: list[JsonValue] = [dict(rule) for rule in rules]
    return ConfigDict(**_BASE_CONFIG, json_schema_extra={"x-kubernetes-validations": validations})


class ApiModel(BaseModel):
    model_config = _BASE_CONFIG

    def to_wire(self) -> dict[str, object]:
        """The object as the apiserver stores it (camelCase, unset optionals omitted)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
