"""Graph spec overrides: TOML, YAML and --set flags, typed, with errors naming the culprit."""

from __future__ import annotations

import pytest

from omni.kernel.errors import GraphError
from omni.config import apply_overrides, load_override_file, parse_set_flags
from omni.kernel.graph import EdgeSpec, Graph, StageSpec
from omni.models.demo.stages import demo_graph


def test_set_flags_are_typed():
    g = apply_overrides(demo_graph(), parse_set_flags(
        ["generator.replicas=2", "vocoder.args.first_chunk_frames=4", "generator.args.step_delay_s=0.5",
         "encoder.device=cpu", "generator.args.tags=[1, 2]"]))
    assert g.stage("generator").replicas == 2
    assert g.stage("vocoder").args["first_chunk_frames"] == 4
    assert g.stage("generator").args["step_delay_s"] == 0.5
    assert g.stage("generator").args["tags"] == [1, 2]


def test_toml_and_yaml_files(tmp_path):
    toml = tmp_path / "o.toml"
    toml.write_text('[stages.generator]\nmax_queue = 8\n[stages.generator.args]\nstep_delay_s = 0.01\n')
    g = apply_overrides(demo_graph(), load_override_file(toml))
    assert g.stage("generator").max_queue == 8 and g.stage("generator").args["step_delay_s"] == 0.01
    yml = tmp_path / "o.yaml"
    yml.write_text("stages:\n  vocoder:\n    credits: 3\n    args: {chunk_frames: 5}\n")
    g = apply_overrides(demo_graph(), load_override_file(yml))
    assert g.stage("vocoder").credits == 3 and g.stage("vocoder").args["chunk_frames"] == 5


@pytest.mark.parametrize("flag, needle", [
    ("nosuch.replicas=2", "nosuch"),
    ("generator.replica=2", "replica"),
    ("generator.replicas=two", "replicas"),
    ("generator", "stage.field=value"),
])
def test_bad_overrides_name_the_problem(flag, needle):
    with pytest.raises(GraphError, match=needle):
        apply_overrides(demo_graph(), parse_set_flags([flag]))


def test_validation_errors():
    with pytest.raises(GraphError, match="no edge into"):
        Graph("g", [StageSpec("a", "demo.encoder")], []).validate()
    with pytest.raises(GraphError, match="unknown stage 'b'"):
        Graph("g", [StageSpec("a", "demo.encoder")], [EdgeSpec("a", "x", "b"), EdgeSpec("a", "y", "$out")]).validate()
    with pytest.raises(GraphError, match="replicas"):
        apply_overrides(demo_graph(), {"generator": {"replicas": 0}})
