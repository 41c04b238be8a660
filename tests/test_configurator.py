import pytest

from configurator import ConfigError, configure

DEFAULTS = dict(batch_size=12, learning_rate=6e-4, compile=True, out_dir="out", block_types=None, backend=None)


def test_overrides_and_types(tmp_path):
    f = tmp_path / "cfg.py"
    f.write_text("batch_size = 4\nlearning_rate = 1\nimport math\n_private = 3\n")
    cfg = configure(DEFAULTS, [str(f), "--compile=False", "--out_dir=123", "--backend=gloo",
                               "--block_types=['spd']*2+['tp']"])
    assert cfg["batch_size"] == 4
    assert cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)  # int widened
    assert cfg["compile"] is False
    assert cfg["out_dir"] == "123"  # a string key keeps the text
    assert cfg["backend"] == "gloo"  # None defaults take any value
    assert cfg["block_types"] == ["spd", "spd", "tp"]
    assert DEFAULTS["batch_size"] == 12  # defaults untouched


@pytest.mark.parametrize("argv, words", [
    (["--nope=1"], ["nope"]),
    (["--batch_size=2.5"], ["batch_size", "int", "float"]),
    (["--compile=1"], ["compile", "bool", "int"]),
    (["--batch_size"], ["--batch_size", "key=value"]),
    (["missing_config.py"], ["missing_config.py", "not found"]),
])
def test_errors_name_key_and_types(argv, words):
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, argv)
    for w in words:
        assert w in str(e.value)


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("batch_sise = 4\n")
    with pytest.raises(ConfigError, match="batch_sise"):
        configure(DEFAULTS, [str(f)])


def test_no_code_execution_from_command_line(tmp_path):
    marker = tmp_path / "pwned"
    cfg = configure(DEFAULTS, [f"--out_dir=__import__('os').mkdir('{marker}')"])
    assert not marker.exists()
    assert cfg["out_dir"].startswith("__import__")  # kept as plain text
    with pytest.raises(ConfigError):
        configure(DEFAULTS, ["--batch_size=__import__('os').getpid()"])
