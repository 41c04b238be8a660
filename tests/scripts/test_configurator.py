import re

import pytest

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure

DEFAULTS = dict(batch_size=12, learning_rate=6e-4, compile=True, out_dir="out", block_types=None,
                backend=None)


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


def _write(path, text):
    path.write_text(text)
    return str(path)


def test_config_file_imports_a_base_beside_it(tmp_path, monkeypatch):
    import sys
    _write(tmp_path / "base_cfg.py", "batch_size = 4\nblock_types = ['tp'] * 2\nout_dir = 'out-base'\n")
    child = _write(tmp_path / "child.py", "# differs from base_cfg only here\nfrom base_cfg import *\n"
                                          "out_dir = 'out-child'\nblock_types.append('spd')\n")
    path_before, modules_before = list(sys.path), set(sys.modules)
    monkeypatch.chdir("/")  # found beside the file, not through the current directory
    cfg = configure(DEFAULTS, [child, "--learning_rate=1"])
    assert cfg["batch_size"] == 4 and cfg["out_dir"] == "out-child" and cfg["learning_rate"] == 1.0
    assert cfg["block_types"] == ["tp", "tp", "spd"]
    assert sys.path == path_before and "base_cfg" not in sys.modules and set(sys.modules) <= modules_before
    assert not (tmp_path / "__pycache__").exists()
    # the base runs afresh on every load and values are copies: no state leaks between loads
    cfg["block_types"].append("parallel")
    again = configure(DEFAULTS, [child])
    assert again["block_types"] == ["tp", "tp", "spd"] and again["block_types"] is not cfg["block_types"]
    _write(tmp_path / "base_cfg.py", "batch_size = 8\nblock_types = ['tp']\n")
    assert configure(DEFAULTS, [child])["batch_size"] == 8


def test_same_base_name_in_two_directories(tmp_path):
    cfgs = []
    for i in (1, 2):
        d = tmp_path / f"d{i}"
        d.mkdir()
        _write(d / "sweep.py", f"batch_size = {i}\n")
        cfgs.append(_write(d / "run.py", "from sweep import *\n"))
    assert [configure(DEFAULTS, [c])["batch_size"] for c in cfgs] == [1, 2]


def test_unknown_key_in_a_base_is_rejected(tmp_path):
    _write(tmp_path / "typo_base.py", "batch_sise = 4\n")
    child = _write(tmp_path / "child.py", "from typo_base import *\nbatch_size = 4\n")
    with pytest.raises(ConfigError, match="batch_sise"):
        configure(DEFAULTS, [child])


def test_missing_base_is_one_line(tmp_path):
    child = _write(tmp_path / "child.py", "from no_such_base import *\n")
    with pytest.raises(ConfigError) as e:
        configure(DEFAULTS, [child])
    msg = str(e.value)
    assert "\n" not in msg and "child.py" in msg and "ModuleNotFoundError" in msg and "no_such_base" in msg


def test_a_json_config_file_is_data(tmp_path):
    """A .json config file is read as data, never run: its keys set the config, an unknown one or a file that
    is not one JSON object is one ConfigError naming the file."""
    defaults = dict(max_iters=10, out_dir="out")
    good = tmp_path / "c.json"
    good.write_text('{"max_iters": 3}')
    assert configure(defaults, [str(good)]) == dict(max_iters=3, out_dir="out")
    for text, words in (('{"max_iter": 3}', "did you mean 'max_iters'"),
                        ('{"max_iters": 3', "not readable as JSON"), ("[1]", "expected a JSON object")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(words)):
            configure(defaults, [str(bad)])
