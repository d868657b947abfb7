"""A model's versions in the repository and its version policy (service/engine/versions.py), and the
exporter's publishing of a new version folder (model_export/publish.py). No model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_export.publish import PublishError, next_version, publish_version
from service.engine.versions import (
    VersionFolder,
    VersionPolicy,
    VersionPolicyError,
    policy_of,
    version_folders,
)


def folders(root: Path, *labels: str) -> list[VersionFolder]:
    for label in labels:
        (root / label).mkdir(parents=True)
        (root / label / "manifest.json").write_text("{}")
    return version_folders(root)


def test_a_flat_folder_is_its_own_one_version(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "7").mkdir()  # numbered folders beside a flat manifest are not versions
    assert version_folders(tmp_path) == [VersionFolder("", tmp_path)]
    assert VersionPolicy().choose(version_folders(tmp_path)) == [VersionFolder("", tmp_path)]


def test_numbered_folders_are_versions_and_others_are_passed_over(tmp_path: Path) -> None:
    found = folders(tmp_path, "1", "10", "2")
    (tmp_path / "3.partial").mkdir()
    (tmp_path / "4").mkdir()  # no manifest yet: not a version
    assert [v.label for v in found] == ["1", "2", "10"]


@pytest.mark.parametrize(
    ("raw", "chosen"),
    [
        (None, ["10"]),
        ({"latest": {"num_versions": 2}}, ["10", "2"]),
        ({"specific": {"versions": [1, 2]}}, ["2", "1"]),
        ({"all": {}}, ["10", "2", "1"]),
    ],
)
def test_a_policy_chooses_newest_first(tmp_path: Path, raw: object, chosen: list[str]) -> None:
    versions = folders(tmp_path, "1", "2", "10")
    policy = VersionPolicy() if raw is None else VersionPolicy.parse(raw)
    assert [v.label for v in policy.choose(versions)] == chosen


@pytest.mark.parametrize(
    "raw",
    [
        {"latest": {"num_versions": 0}},
        {"specific": {"versions": []}},
        {"newest": {}},
        "all",
        {"all": {}, "latest": {}},
    ],
)
def test_a_policy_that_is_not_one_is_refused_saying_what_is(raw: object) -> None:
    with pytest.raises(VersionPolicyError, match="is not one of"):
        VersionPolicy.parse(raw)


def test_the_setting_overrides_the_models_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"version_policy": {"all": {}}}')
    assert policy_of(tmp_path).every
    assert policy_of(tmp_path, {"latest": {"num_versions": 3}}).latest == 3
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(VersionPolicyError, match=r"config\.json is not valid JSON"):
        policy_of(tmp_path)


def test_publishing_renames_a_finished_build_to_the_next_version(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "gpt"
    assert next_version(model) == 1
    staged = tmp_path / "repo" / ".staging" / "gpt"
    staged.mkdir(parents=True)
    (staged / "manifest.json").write_text("{}")
    assert publish_version(staged, model) == model / "1"
    assert not staged.exists() and (model / "1" / "manifest.json").is_file()
    staged.mkdir()
    with pytest.raises(PublishError, match="did not finish"):
        publish_version(staged, model)
    (staged / "manifest.json").write_text("{}")
    assert publish_version(staged, model).name == "2"


def test_a_flat_model_folder_takes_no_numbered_version_beside_it(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(PublishError, match="move its files into"):
        next_version(tmp_path)
