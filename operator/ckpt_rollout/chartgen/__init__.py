"""The Helm chart's generated files (values.yaml, values.schema.json, the CRD template) from the
values model: `python -m ckpt_rollout.chartgen.chart_files`."""
