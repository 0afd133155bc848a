"""A job document whose kind or apiVersion is not a string is bad input, never a crash."""

from __future__ import annotations

import pytest

from gpuyard.apis.jobs import JobValidationError, parse_job


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"kind": ["TFJob"], "apiVersion": "kubeflow.org/v1", "metadata": {"name": "a"}}, "kind"),
        ({"kind": "TFJob", "apiVersion": ["kubeflow.org/v1"], "metadata": {"name": "a"}}, "apiVersion"),
        ({"kind": "TFJob", "apiVersion": None, "metadata": {"name": "a"}}, "apiVersion"),
    ],
)
def test_kind_and_api_version_must_be_known_strings(doc, field):
    with pytest.raises(JobValidationError) as err:
        parse_job(doc)
    assert [d["field"] for d in err.value.details] == [field]
