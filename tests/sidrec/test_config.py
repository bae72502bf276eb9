from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sidrec.config import Settings, apply_overrides, load_settings, parse_override
from sidrec.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_repo_params_yaml_is_valid_and_matches_defaults():
    settings = load_settings(REPO / "params.yaml")
    # params.yaml holds every key, with the model's defaults; the presets it alone defines
    assert settings.model_copy(update={"presets": {}, "profiles": {}}) == Settings()
    assert set(settings.presets) == {"quality"}
    assert set(settings.profiles) == {"movielens-1m", "amazon-beauty"}
    assert settings.paths.raw("items") == Path("data/raw/ml-100k/items.parquet")


def test_override_parses_yaml_values():
    assert parse_override("split.max_history=10") == (["split", "max_history"], 10)
    assert parse_override("ingest.min_rating=null") == (["ingest", "min_rating"], None)
    assert parse_override("split.ratios=[0.7, 0.2, 0.1]") == (["split", "ratios"], [0.7, 0.2, 0.1])


def test_overrides_change_only_their_key(project):
    settings = load_settings("params.yaml", ["split.max_history=7", "ingest.amazon.k_core=10"])
    assert settings.split.max_history == 7
    assert settings.ingest.amazon.k_core == 10
    assert settings.split.method == "leave_one_out"


def test_apply_overrides_does_not_mutate_input():
    raw = {"split": {"max_history": 20}}
    apply_overrides(raw, ["split.max_history=5"])
    assert raw == {"split": {"max_history": 20}}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("split.max_histroy=5", "split.max_histroy: unknown key"),
        ("nosuchsection.key=1", "nosuchsection: unknown key"),
        ("split.max_history=0", "split.max_history: Input should be greater than or equal to 1"),
        (
            "split.method=random",
            "split.method: Input should be 'leave_one_out' or 'sliding_window'",
        ),
        (
            "sids.embedding=graph",
            "sids.embedding: Input should be 'text', 'collaborative' or 'hybrid' (got 'graph')",
        ),
        ("sids.collaborative_dim=0", "sids.collaborative_dim: Input should be greater than"),
        ("sids.rqvae.hidden_dims=[64, 0]", "sids.rqvae.hidden_dims.1: Input should be greater"),
        ("ingest.source=csv", "source 'csv' needs ingest.interactions, ingest.items"),
        ("split.ratios=[0.5, 0.5, 0.5]", "ratios must be three positive numbers summing to 1"),
        (
            "validate.min_user_interactions=2",
            "leave_one_out needs validate.min_user_interactions >= 3",
        ),
        ("project.dataset=../escape", "project.dataset: String should match pattern"),
        ("sft.window_stride=60", "sft: window_stride (60) > window (50) would skip items"),
        (
            "sft.window=20",  # below the default stride: the message says which key to set
            "window_stride (25) > window (20) would skip items between windows; set "
            "sft.window_stride to at most 20, or null",
        ),
        ("evaluate.ks=[]", "evaluate: ks must be distinct cut-offs >= 1"),
        ("evaluate.ks=[0, 10]", "evaluate: ks must be distinct cut-offs >= 1"),
        ("evaluate.ks=[10, 10]", "evaluate: ks must be distinct cut-offs >= 1"),
        ("evaluate.num_beams=5", "num_beams (5) must be >= the largest K in ks (20)"),
        ("register.gate_metric=valid.ndcg@50", "valid.ndcg@50 needs K=50 in evaluate.ks"),
    ],
)
def test_bad_values_are_reported_with_their_key(project, override, expected):
    with pytest.raises(ConfigError) as err:
        load_settings("params.yaml", [override])
    assert expected in str(err.value)


def test_a_rating_filter_on_a_source_without_ratings_is_refused(project):
    folder = ["ingest.source=minionerec", "ingest.path=/data/minionerec"]
    with pytest.raises(ConfigError, match=r"ingest: min_rating=4.0 but MiniOneRec files carry"):
        load_settings("params.yaml", [*folder, "ingest.min_rating=4"])
    load_settings("params.yaml", folder)


def test_an_incremental_run_cannot_also_import_sids(project):
    with pytest.raises(ConfigError, match=r"sids: sids.incremental=true and sids.import_index"):
        load_settings("params.yaml", ["sids.incremental=true", "sids.import_index=x.index.json"])
    load_settings("params.yaml", ["sids.import_index=x.index.json"])


def test_a_teacher_share_without_the_teacher_is_refused(project):
    with pytest.raises(ConfigError, match=r"sft: .*distill_future=0.3 .* but distill is 0"):
        load_settings("params.yaml", ["sft.distill=0", "sft.distill_future=0.3"])
    with pytest.raises(ConfigError, match=r"sft: .*distill_ease=0.25 blends EASE .* distill is 0"):
        load_settings("params.yaml", ["sft.distill=0", "sft.distill_ease=0.25"])
    load_settings("params.yaml", ["sft.distill=0"])  # no share: fine


def test_a_gate_cut_off_outside_evaluate_ks_is_fine_without_registration(project):
    settings = load_settings(
        "params.yaml", ["register.gate_metric=valid.ndcg@50", "register.enabled=false"]
    )
    assert settings.evaluate.ks == [1, 5, 10, 20]


def test_malformed_override_and_files(project, tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_settings("params.yaml", ["max_history"])
    with pytest.raises(ConfigError, match="configuration file not found"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not a file; --config takes a params.yaml file"):
        load_settings(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("split: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)


def test_settings_are_frozen():
    settings = Settings()
    with pytest.raises(Exception, match="frozen"):
        settings.split.max_history = 3  # type: ignore[misc]


def test_resolved_config_round_trips(tmp_path):
    from sidrec.config import dump_settings

    settings = load_settings(REPO / "params.yaml", ["split.max_history=9"])
    dump_settings(settings, tmp_path / "resolved.yaml")
    again = load_settings(tmp_path / "resolved.yaml")
    assert again == settings
    assert (
        yaml.safe_load((tmp_path / "resolved.yaml").read_text())["validate"][
            "min_user_interactions"
        ]
        == 5
    )


def test_renamed_keys_name_their_new_place(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["evaluate"] |= {"sasrec_max_epochs": 50, "sasrec_patience": 3}
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError) as err:
        load_settings(old)
    assert "evaluate.sasrec_patience was renamed: use sasrec.patience" in str(err.value)
    assert "evaluate.sasrec_max_epochs was renamed: use sasrec.max_epochs" in str(err.value)
    assert "unknown key" not in str(err.value)


def test_sasrec_heads_must_divide_hidden(project):
    with pytest.raises(
        ConfigError, match=r"sasrec.heads: must divide sasrec.hidden \(10\) \(got 3\)"
    ):
        load_settings("params.yaml", ["sasrec.hidden=10", "sasrec.heads=3"])
    assert load_settings("params.yaml", ["sasrec.max_len=50"]).sasrec.max_len == 50


def test_a_preset_replaces_its_keys_and_set_still_wins():
    quality = load_settings(REPO / "params.yaml", ["project.preset=quality", "sft.epochs=5"])
    assert (quality.model.tiny.hidden_size, quality.model.tiny.layers) == (256, 4)
    assert quality.sft.learning_rate == 0.001 and quality.grpo.max_steps == 600
    assert quality.sft.epochs == 5  # --set over the preset
    assert quality.sft.window_stride is None  # its schedule was measured on plain windows
    default = load_settings(REPO / "params.yaml")
    # data, SIDs and the SASRec baseline are the same under every preset
    for section in ("ingest", "split", "embed", "sids", "sasrec", "evaluate"):
        assert quality.section(section) == default.section(section)
    assert default.model.tiny.hidden_size == 128 and default.project.preset == "default"


def test_bad_presets_are_config_errors():
    with pytest.raises(ConfigError, match=r"unknown preset 'fast' \(default, quality\)"):
        load_settings(REPO / "params.yaml", ["project.preset=fast"])
    with pytest.raises(ConfigError, match="a preset may set keys of model, sft, grpo only"):
        load_settings(REPO / "params.yaml", ["presets.fast={sasrec.lr: 1}", "project.preset=fast"])
    with pytest.raises(ConfigError, match="model.tiny.depth: unknown key"):
        load_settings(
            REPO / "params.yaml",
            ["presets.quality={model.tiny.depth: 3}", "project.preset=quality"],
        )


@pytest.mark.parametrize(
    "overrides",
    [
        ["presets.long={sft: {epochs: 20}}", "project.preset=long"],
        ["presets.quality.sft.epochs=3"],  # nests {"sft": {"epochs": 3}} into the preset
        ["presets.long={model.tiny: {layers: 3}}"],
    ],
)
def test_a_preset_key_naming_a_section_is_refused(overrides):
    # applied, it would reset every other key of that section to its default
    with pytest.raises(ConfigError, match="a preset key names one setting as section.key"):
        load_settings(REPO / "params.yaml", overrides)


def test_a_misspelt_preset_key_is_refused_before_the_preset_is_chosen():
    with pytest.raises(ConfigError, match=r"presets.fast: unknown key\(s\) sft.epoch "):
        load_settings(REPO / "params.yaml", ["presets.fast={sft.epoch: 3}"])


@pytest.mark.parametrize("override", ["project=5", "project=[a]", "project.preset=[quality]"])
def test_a_malformed_project_section_is_a_config_error(override):
    with pytest.raises(ConfigError, match="project"):
        load_settings(REPO / "params.yaml", [override])


def test_literal_overrides_keep_the_text_as_given():
    from sidrec.config import literal_override

    settings = load_settings(
        REPO / "params.yaml",
        [
            literal_override("project.dataset", "2023"),
            literal_override("ingest.interactions", "/data/a #1.csv"),
        ],
    )
    assert settings.project.dataset == "2023"
    assert str(settings.ingest.interactions) == "/data/a #1.csv"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.tiny.kv_heads=3", r"model.tiny.kv_heads \(3\) must divide model.tiny.heads \(4\)"),
        (
            "model.tiny.heads=3",
            r"model.tiny.heads \(3\) must divide model.tiny.hidden_size \(128\)",
        ),
        ("sft.tasks=[]", "sft.tasks: List should have at least 1 item"),
    ],
)
def test_model_shapes_and_sft_tasks_that_cannot_train_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(REPO / "params.yaml", [override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.preset=hf"], "model.preset hf needs model.name_or_path"),
        (["model.name_or_path=Qwen/Qwen2.5-0.5B"], "read under model.preset hf only"),
    ],
)
def test_name_or_path_goes_with_the_hf_preset(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(REPO / "params.yaml", overrides)
    assert load_settings(REPO / "params.yaml", ["model.preset=hf", "model.name_or_path=x"])


def test_a_built_in_source_comes_with_its_profile_and_its_dataset_name():
    default = load_settings(REPO / "params.yaml")
    assert (default.profile, default.project.dataset) == (None, "ml-100k")
    # movielens-100k has no profile: the sections as written, whatever the source flag says
    again = load_settings(REPO / "params.yaml", ["ingest.source=movielens-100k"])
    assert again == default
    ml1m = load_settings(REPO / "params.yaml", ["ingest.source=movielens-1m"])
    assert (ml1m.profile, ml1m.project.dataset) == ("movielens-1m", "movielens-1m")
    assert (ml1m.split.max_history, ml1m.sasrec.max_len) == (200, 200)
    beauty = load_settings(REPO / "params.yaml", ["ingest.source=amazon-beauty"])
    assert (beauty.profile, beauty.project.dataset) == ("amazon-beauty", "amazon-beauty")
    assert (beauty.split.max_history, beauty.sasrec.max_len) == (20, 20)
    assert ml1m.sft.epochs == 4 and beauty.sft.epochs == default.sft.epochs
    # every other key is ml-100k's
    for section in ("validate", "embed", "sids", "model", "grpo", "evaluate"):
        assert ml1m.section(section) == beauty.section(section) == default.section(section)
    assert ml1m.section("sft") == {**default.section("sft"), "epochs": 4}
    assert beauty.section("sft") == default.section("sft")
    off = load_settings(
        REPO / "params.yaml", ["ingest.source=movielens-1m", "project.profile=none"]
    )
    assert (off.profile, off.split.max_history, off.sasrec.max_len) == (None, 20, None)


CSV = ["ingest.source=csv", "ingest.interactions=i.csv", "ingest.items=t.csv"]


def test_a_profile_applies_by_name_to_any_source():
    plain = load_settings(REPO / "params.yaml", CSV)
    assert (plain.profile, plain.sasrec.max_len) == (None, None)
    beauty = load_settings(REPO / "params.yaml", [*CSV, "project.profile=amazon-beauty"])
    assert (beauty.profile, beauty.sasrec.max_len) == ("amazon-beauty", 20)
    ml1m = load_settings(REPO / "params.yaml", [*CSV, "project.profile=movielens-1m"])
    assert (ml1m.split.max_history, ml1m.project.dataset) == (200, "csv")


def test_profile_then_preset_then_set():
    # the quality preset sets sft.epochs to 10
    profile = [
        "ingest.source=movielens-1m",
        "profiles.movielens-1m={split.max_history: 200, sft.epochs: 3}",
    ]
    assert load_settings(REPO / "params.yaml", profile).sft.epochs == 3
    quality = load_settings(REPO / "params.yaml", [*profile, "project.preset=quality"])
    assert (quality.sft.epochs, quality.split.max_history) == (10, 200)
    assert quality.model.tiny.hidden_size == 256
    won = [*profile, "project.preset=quality", "sft.epochs=5", "split.max_history=50"]
    overridden = load_settings(REPO / "params.yaml", won)
    assert (overridden.sft.epochs, overridden.split.max_history) == (5, 50)


def test_bad_profiles_are_config_errors():
    with pytest.raises(ConfigError, match=r"unknown profile 'tiny' \(auto, none, "):
        load_settings(REPO / "params.yaml", ["project.profile=tiny"])
    with pytest.raises(ConfigError, match="a profile may set keys of split, sasrec, sids, model"):
        load_settings(REPO / "params.yaml", ["profiles.x={evaluate.ks: [10]}"])
    with pytest.raises(ConfigError, match=r"profiles.x: unknown key\(s\) split.max_histroy"):
        load_settings(REPO / "params.yaml", ["profiles.x={split.max_histroy: 3}"])
    with pytest.raises(ConfigError, match="auto: reserved by project.profile"):
        load_settings(REPO / "params.yaml", ["profiles.auto={split.max_history: 3}"])
    with pytest.raises(ConfigError, match="a profile key names one setting as section.key"):
        load_settings(REPO / "params.yaml", ["profiles.x={split: {max_history: 3}}"])


def test_a_built_in_source_without_its_profile_is_refused(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    del params["profiles"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"auto applies source amazon-beauty's own profile, "):
        load_settings(tmp_path / "params.yaml", ["ingest.source=amazon-beauty"])
    off = ["ingest.source=amazon-beauty", "project.profile=none"]
    assert load_settings(tmp_path / "params.yaml", off).profile is None


def test_an_unknown_profile_exits_1_through_the_cli(project):
    from typer.testing import CliRunner

    from sidrec.cli import app

    result = CliRunner().invoke(app, ["ingest", "--set", "project.profile=tiny"])
    assert result.exit_code == 1, result.output
    assert "unknown profile 'tiny' (auto, none, " in result.output
    assert not (project / "data").exists()


def test_the_dataset_defaults_to_the_sources_name(tmp_path):
    from sidrec.cli import Options

    def dataset(source: str | None, name: str | None = None, config: Path = REPO / "params.yaml"):
        files = {"interactions": Path("i.csv"), "items": Path("t.csv"), "path": None}
        opts = Options(config=config, set_=None, source=source, dataset=name, debug=False, **files)
        return opts.settings().project.dataset

    assert dataset(None) == dataset("movielens-100k") == "ml-100k"
    assert dataset("movielens-1m") == "movielens-1m"
    assert dataset("amazon-beauty") == "amazon-beauty"
    assert dataset("csv") == "csv"  # not ml-100k's folder
    assert dataset("movielens-1m", "ml1m-200") == "ml1m-200"
    # a source params.yaml names keeps params.yaml's dataset
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["project"]["dataset"] = "shop"
    params["ingest"] |= {"source": "csv", "interactions": "i.csv", "items": "t.csv"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert dataset("csv", config=tmp_path / "params.yaml") == "shop"
    assert dataset("movielens-1m", config=tmp_path / "params.yaml") == "movielens-1m"


def test_a_built_in_source_never_writes_into_another_ones_dataset(tmp_path):
    with pytest.raises(ConfigError, match=r"project.dataset 'ml-100k' is the folder of source "):
        load_settings(
            REPO / "params.yaml", ["ingest.source=movielens-1m", "project.dataset=ml-100k"]
        )
    # as `dvc exp run -S ingest.source=amazon-beauty` leaves params.yaml
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["ingest"]["source"] = "amazon-beauty"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match="ingest.source is amazon-beauty; set project.dataset"):
        load_settings(tmp_path / "params.yaml")
    assert load_settings(REPO / "params.yaml", [*CSV, "project.dataset=ml-100k"])  # csv: free


def test_a_resolved_config_with_a_profile_round_trips(tmp_path):
    from sidrec.config import dump_settings

    chosen = ["ingest.source=movielens-1m", "project.preset=quality", "split.max_history=50"]
    settings = load_settings(REPO / "params.yaml", chosen)
    dump_settings(settings, tmp_path / "resolved.yaml")
    again = load_settings(tmp_path / "resolved.yaml")
    # the layers in force hold the sections' values (--set changed one), so they apply alike
    layers = {"profiles": {}, "presets": {}}
    assert again.model_copy(update=layers) == settings.model_copy(update=layers)
    assert again.profiles["movielens-1m"] == {
        "split.max_history": 50,
        "sasrec.max_len": 200,
        "sft.epochs": settings.sft.epochs,  # the quality preset's, applied after the profile
    }
    assert settings.sft.epochs == settings.presets["quality"]["sft.epochs"]


def test_stages_that_read_a_profiles_keys_declare_the_profile():
    from sidrec.config import PROFILE_SECTIONS
    from sidrec.stage import STAGE_PARAMS

    for stage, keys in STAGE_PARAMS.items():
        reads = any(key.split(".")[0] in PROFILE_SECTIONS for key in keys)
        assert reads == ({"project.profile", "profiles"} <= set(keys)), stage
