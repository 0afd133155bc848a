"""`-o jsonpath=...`: kubectl's template subset, and `-o name`."""

from __future__ import annotations

import click
import pytest

from gpuyard.cli.jsonpath import JsonPathError, render
from gpuyard.cli.output import OutputFormat, object_name

LIST = {
    "kind": "List",
    "items": [
        {"kind": "TFJob", "metadata": {"name": "a", "namespace": "x", "labels": {"app.io/tier": "gpu"}}},
        {"kind": "PyTorchJob", "metadata": {"name": "b", "namespace": "y"}, "status": {"phase": "Running"}},
    ],
}


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ("{.items[*].metadata.name}", "a b"),
        ("{.items[0].kind}", "TFJob"),
        ("{.items[-1].status.phase}", "Running"),
        ('{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\\n"}{end}', "x/a\ny/b\n"),
        ("names: {.items[*].metadata.name}!", "names: a b!"),
        ("{.items[0].metadata.labels['app.io/tier']}", "gpu"),
        ("{.items[0].metadata.labels}", '{"app.io/tier":"gpu"}'),
        ("{.items[5].metadata.name}", ""),
        ("{.kind}", "List"),
    ],
)
def test_templates(template: str, text: str) -> None:
    assert render(template, LIST) == text


@pytest.mark.parametrize("template", ["{.items[*]", "{range .items[*]}{.a}", "{end}", "{.items[x]}"])
def test_a_bad_template_is_named(template: str) -> None:
    with pytest.raises(JsonPathError):
        render(template, LIST)


def test_the_output_option_takes_kubectls_forms() -> None:
    fmt = OutputFormat()
    assert (
        fmt.convert("jsonpath='{.items[*].metadata.name}'", None, None)
        == "jsonpath={.items[*].metadata.name}"
    )
    assert fmt.convert("name", None, None) == "name"
    with pytest.raises(click.BadParameter, match="not an output format"):
        fmt.convert("xml", None, None)
    with pytest.raises(click.BadParameter, match="unclosed"):
        fmt.convert("jsonpath={.items", None, None)


def test_object_names_are_kind_slash_name() -> None:
    assert object_name(LIST["items"][0]) == "tfjob/a"
    assert object_name({"metadata": {"name": "p"}}, "Pod") == "pod/p"
