"""The source allow-list (ckpt_api.source_policy): rule parsing and what each rule lets through."""

from __future__ import annotations

import ipaddress

import pytest

from ckpt_api.source_policy import SourcePolicy, SourceRefused, is_link_local, parse_rule, special_kind

RULES = [
    "https://ckpt.example.com/rl",
    "http://*.cache.example.com:8080",
    "mooncake://10.0.0.0/8",
    "http://[fd00::]/8/published",
    "file:///mnt/ckpt",
]
POLICY = SourcePolicy.parse(RULES)

ALLOWED = [
    "https://ckpt.example.com/rl",
    "https://ckpt.example.com/rl/",
    "https://CKPT.example.com/rl/step-10",
    "http://a.cache.example.com:8080/",
    "http://b.a.cache.example.com:8080/x",
    "mooncake://10.1.2.3:50051",
    "mooncake://store.internal:50051",  # a name: its resolved addresses decide (check_address)
    "http://[fd00::1]:80/published/v1",
    "file:///mnt/ckpt",
    "file:///mnt/ckpt/run-7",
]
REFUSED = [
    ("https://ckpt.example.com/rl-other", "not among the allowed sources"),
    ("https://ckpt.example.com/rl/../admin", "not among the allowed sources"),
    ("http://ckpt.example.com/rl", "not among the allowed sources"),  # scheme
    ("https://evil.example.com/rl", "not among the allowed sources"),
    ("http://cache.example.com:8080/", "not among the allowed sources"),  # *. needs a subdomain
    ("http://a.cache.example.com:8081/", "not among the allowed sources"),  # port
    ("mooncake://11.0.0.1:50051", "not among the allowed sources"),
    ("http://[fd00::1]:80/other", "not among the allowed sources"),
    ("file:///mnt/ckpt-other", "not among the allowed sources"),
    ("file:///mnt/ckpt/../../etc", "not among the allowed sources"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://[fe80::1]:80/", "link-local"),
]


@pytest.mark.parametrize("uri", ALLOWED)
def test_allowed(uri: str) -> None:
    POLICY.check_uri(uri)


@pytest.mark.parametrize(("uri", "why"), REFUSED)
def test_refused_with_the_reason(uri: str, why: str) -> None:
    with pytest.raises(SourceRefused, match=why):
        POLICY.check_uri(uri)


def test_no_rules_allows_any_source_but_link_local_unless_asked() -> None:
    open_policy = SourcePolicy()
    open_policy.check_uri("http://anything.example:1/x")
    open_policy.check_uri("file:///anywhere")
    with pytest.raises(SourceRefused, match="link-local"):
        open_policy.check_uri("http://169.254.1.1/")
    with pytest.raises(SourceRefused, match=r"link-local address 169\.254\.169\.254"):
        open_policy.check_address("http://metadata.internal/", ipaddress.ip_address("169.254.169.254"))
    permissive = SourcePolicy(allow_link_local=True)
    permissive.check_uri("http://169.254.1.1/")
    permissive.check_address("http://x/", ipaddress.ip_address("fe80::2"))


@pytest.mark.parametrize(
    ("uri", "address", "allowed"),
    [
        ("mooncake://store.internal:50051", "10.9.9.9", True),
        ("mooncake://store.internal:50051", "192.168.0.1", False),
        ("https://ckpt.example.com/rl/v1", "192.168.0.1", True),  # a name rule: any address of it
        ("https://ckpt.example.com/rl/v1", "169.254.169.254", False),  # ... but never link-local
        ("http://[fd00::1]:80/published", "fd00::1", True),
        ("http://x.cache.example.com:8080/", "::ffff:169.254.169.254", False),  # v4-mapped
    ],
)
def test_resolved_addresses(uri: str, address: str, allowed: bool) -> None:
    ip = ipaddress.ip_address(address)
    if allowed:
        POLICY.check_address(uri, ip)
    else:
        with pytest.raises(SourceRefused):
            POLICY.check_address(uri, ip)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "reserved"),
    ],
)
def test_a_name_rule_never_reaches_a_special_address(address: str, kind: str) -> None:
    """Whoever controls a zone under an allowed name may point it anywhere: at this pod's own
    loopback (the engine's admin port), at the metadata service. A name (``*.suffix``, ``*``)
    rule allows only ordinary addresses; an address rule containing it allows the rest."""
    ip = ipaddress.ip_address(address)
    assert special_kind(ip) == kind
    names = SourcePolicy.parse(["http://*.ckpt.test", "http://*"], allow_link_local=True)
    with pytest.raises(SourceRefused, match=f"resolves to the {kind} address"):
        names.check_address("http://weights.ckpt.test/v1", ip)
    network = f"[{ip}]" if ip.version == 6 else str(ip)
    explicit = SourcePolicy.parse(["http://*.ckpt.test", f"http://{network}"], allow_link_local=True)
    explicit.check_address("http://weights.ckpt.test/v1", ip)


@pytest.mark.parametrize("address", ["10.1.2.3", "192.168.0.1", "fd00::1", "8.8.8.8", "100.64.0.1"])
def test_ordinary_addresses_private_ones_included_are_a_names_to_reach(address: str) -> None:
    """In-cluster sources (Services, pods) live on private networks."""
    assert special_kind(ipaddress.ip_address(address)) is None
    SourcePolicy.parse(["http://*.ckpt.test"]).check_address(
        "http://weights.ckpt.test/", ipaddress.ip_address(address)
    )


def test_a_literal_loopback_source_needs_an_address_rule_too() -> None:
    """Checked at the URI already, so the operator stalls such a rollout before an agent is asked."""
    with pytest.raises(SourceRefused, match=r"loopback address 127\.0\.0\.1"):
        SourcePolicy.parse(["http://*"]).check_uri("http://127.0.0.1:8000/ckpt")
    SourcePolicy.parse(["http://*", "http://127.0.0.0/8"]).check_uri("http://127.0.0.1:8000/ckpt")
    SourcePolicy().check_uri("http://127.0.0.1:8000/ckpt")  # no rules: any source


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ("ckpt.example.com", "is not scheme://host"),
        ("ftp://host", "scheme must be one of"),
        ("http://", "names no host"),
        ("http://a.*.example.com", "only a leading"),
        ("http://10.0.0.1/33", "10.0.0.1/33"),
        ("http://10.0.0.1/8", "has host bits set"),
        ("file://host/path", "names a path only"),
        ("http://h:70000", "out of range"),
        ("https://h/a/../b", "normalised"),
    ],
)
def test_bad_rules_say_why(rule: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_rule(rule)


def test_an_address_rule_prints_as_the_address() -> None:
    assert [str(parse_rule(r)) for r in ("http://127.0.0.1:8000", "http://[::1]:80/x")] == [
        "http://127.0.0.1:8000",
        "http://[::1]:80/x",
    ]


def test_rules_print_as_written_in_normal_form() -> None:
    assert [str(parse_rule(r)) for r in RULES] == [
        "https://ckpt.example.com/rl",
        "http://*.cache.example.com:8080",
        "mooncake://10.0.0.0/8",
        "http://[fd00::]/8/published",
        "file:///mnt/ckpt",
    ]


def test_link_local_covers_both_families() -> None:
    assert is_link_local(ipaddress.ip_address("169.254.0.1"))
    assert is_link_local(ipaddress.ip_address("fe80::1"))
    assert not is_link_local(ipaddress.ip_address("10.0.0.1"))
    assert not is_link_local(ipaddress.ip_address("127.0.0.1"))
