"""
bench.py's options (DEFAULTS: every model key train.py takes, plus what to time and how) and their
checks, before any work: ConfigError naming key and value. The model options are checked by
tpcomm/model/options.py, as train.py's.
"""


from tpcomm.errors import ConfigError
from model import GPTConfig
from tpcomm.parallel.data_parallel import DATA_PARALLEL, INIT_DEVICES
from tpcomm.model.options import (TP_COMM_OPTIONS, TP_DEFAULTS, check_batch, compact_list, model_config,
                                  validate_tp_args)
from tpcomm.train.output_path import check_output_file, written_by
from tpcomm.parallel.parallel_dims import world_size
from tpcomm.parallel.pipeline_config import validate_pp_layout
from tpcomm.train.runtime import check_dtype
from tpcomm.train.train_config import DEFAULTS as TRAIN_DEFAULTS, with_type_options

DEFAULTS = dict(
    model_type=TRAIN_DEFAULTS["model_type"],
    tp_size=TP_DEFAULTS["tp_size"],
    block_types=TP_DEFAULTS["block_types"],
    # here too (defaults()): each block type's own options, as train.py takes them (caat_sync_fraction)
    patterns=None,  # distributed_gpt: a list of block_types values to time in one run, instead of block_types
    # distributed_gpt: several ways to move the syncs in one run, a list of dicts of tp_overlap /
    # sequence_parallel / tp_comm_dtype / tp_comm_block / tp_comm_exchange over the flags below, each timed
    # with every pattern ({}: the flags as given), e.g. "[{}, {'tp_overlap': 2}, {'sequence_parallel': True},
    # {'tp_comm_dtype': 'int8'}]"
    variants=None,
    tp_mode=TRAIN_DEFAULTS["tp_mode"],
    # distributed_gpt: how the syncs move, as train.py takes them (each variant above changes them for its
    # rows)
    tp_overlap=TP_DEFAULTS["tp_overlap"],
    tp_async_grad=TP_DEFAULTS["tp_async_grad"],
    sequence_parallel=TP_DEFAULTS["sequence_parallel"],
    tp_comm_dtype=TP_DEFAULTS["tp_comm_dtype"],
    tp_comm_block=TP_DEFAULTS["tp_comm_block"],
    tp_comm_exchange=TP_DEFAULTS["tp_comm_exchange"],
    tp_collective_matmul=TP_DEFAULTS["tp_collective_matmul"],
    n_layer=TRAIN_DEFAULTS["n_layer"],
    n_head=TRAIN_DEFAULTS["n_head"],
    n_embd=TRAIN_DEFAULTS["n_embd"],
    block_size=TRAIN_DEFAULTS["block_size"],
    vocab_size=GPTConfig.vocab_size,
    bias=TRAIN_DEFAULTS["bias"],
    gelu_approximate=TRAIN_DEFAULTS["gelu_approximate"],
    batch_size=TRAIN_DEFAULTS["batch_size"],
    iters=20,  # timed steps per model
    warmup=5,  # untimed steps per model
    compare=True,  # distributed_gpt: also time GPT of the same sizes and print the ratio
    # 'train': training steps | 'decode': generation with the KV cache (prefill, then per token)
    mode="train",
    batch_sizes=None,  # decode: the batch sizes to time (None: [batch_size])
    prompt_len=None,  # decode: prompt tokens (None: block_size // 2)
    new_tokens=32,  # decode: generated tokens per timing (prompt_len + new_tokens <= block_size)
    plot=None,  # a PNG path: decode, ms/token vs forward all-reduces; train (real TP), each step's time split
    # memory: 'ddp' | 'fsdp' over the data-parallel ranks (world / tp processes)
    data_parallel=TRAIN_DEFAULTS["data_parallel"],
    # 'default': build on the device | 'meta': build without memory, materialise each rank's part
    init_device=TRAIN_DEFAULTS["init_device"],
    loss_parallel=TP_DEFAULTS["loss_parallel"],  # distributed_gpt: the vocabulary-parallel lm_head and loss
    trace=None,  # train: a path; profile trace_steps more steps of each model and write a Chrome trace there
    trace_steps=1,  # train: the steps each trace holds
    # train: profile this many more steps of each model per round; print the self CPU time per op group
    profile=0,
    # pipeline: stages (torchrun with pp_size x tp processes; pp_size 1 under torchrun too)
    pp_size=TRAIN_DEFAULTS["pp_size"],
    pp_schedules=["gpipe", "1f1b"],  # pipeline: the schedules to time ('gpipe' | '1f1b' | 'interleaved_1f1b')
    microbatches=[4, 8],  # pipeline: the micro-batch counts m to time (micro-batches of batch_size rows)
    pp_virtual_stages=2,  # pipeline: stages per pp rank of 'interleaved_1f1b'
    device=TRAIN_DEFAULTS["device"],
    dtype=TRAIN_DEFAULTS["dtype"],
    compile=False,
    backend=TRAIN_DEFAULTS["backend"],
    seed=TRAIN_DEFAULTS["seed"],
)


def defaults():
    """bench.py's options and their defaults: DEFAULTS and the block types' own options."""
    return with_type_options(DEFAULTS)


POSITIVE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size", "iters")


def validate(cfg):
    """Every option but the launch (parallel_dims.check_layout), before any work: ConfigError naming key and
    value."""
    for key in POSITIVE_KEYS + ("warmup",):
        value, least = cfg[key], 0 if key == "warmup" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigError(f"{key} must be an int >= {least}, got {value!r}")
    check_dtype(cfg["dtype"])
    if cfg["mode"] not in ("train", "decode", "memory", "pipeline"):
        raise ConfigError(f"mode must be 'train', 'decode', 'memory' or 'pipeline', got {cfg['mode']!r}")
    if cfg["mode"] != "pipeline" and cfg["pp_size"] != 1:
        raise ConfigError(f"pp_size applies to mode='pipeline' only, got pp_size={cfg['pp_size']!r} with "
                          f"mode={cfg['mode']!r}; drop pp_size or give --mode=pipeline")
    if cfg["data_parallel"] not in DATA_PARALLEL:
        raise ConfigError(f"data_parallel must be one of {DATA_PARALLEL}, got {cfg['data_parallel']!r}")
    if cfg["init_device"] not in INIT_DEVICES:
        raise ConfigError(f"init_device must be one of {INIT_DEVICES}, got {cfg['init_device']!r}")
    check_models(cfg)
    profile = cfg["profile"]
    if not isinstance(profile, int) or isinstance(profile, bool) or profile < 0:
        raise ConfigError(f"profile must be an int >= 0 (steps per model and round), got {profile!r}")
    if profile and cfg["mode"] != "train":
        raise ConfigError(f"profile breaks training steps down: it needs mode='train', got "
                          f"mode={cfg['mode']!r}")
    trace, n = cfg["trace"], cfg["trace_steps"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"trace_steps must be an int >= 1, got {n!r}")
    if trace is not None:
        # an earlier trace of ours may be replaced
        check_output_file(trace, key="trace", own=written_by("trace"))
        if cfg["mode"] != "train":
            raise ConfigError(f"trace profiles training steps: it needs mode='train', got "
                              f"mode={cfg['mode']!r}")
    if cfg["plot"] is not None:
        # the figure it draws (bench.py)
        kind = "figure decode" if cfg["mode"] == "decode" else "figure steps"
        check_output_file(cfg["plot"], key="plot", own=written_by(kind), suffixes=(".png",))
        if cfg["mode"] != "decode" and cfg["tp_mode"] != "real":  # train mode: each real-TP step's time split
            raise ConfigError(f"plot draws the decode timings (mode='decode') or, with tp_mode='real', each "
                              "training " f"step's compute and communication; got mode={cfg['mode']!r}, "
                              f"tp_mode={cfg['tp_mode']!r}")
    if cfg["mode"] == "decode":
        sizes = cfg["batch_sizes"] if cfg["batch_sizes"] is not None else [cfg["batch_size"]]
        if not isinstance(sizes, list) or not sizes or any(type(b) is not int or b < 1 for b in sizes):
            raise ConfigError(f"batch_sizes must be a non-empty list of ints >= 1, got "
                              f"{cfg['batch_sizes']!r}")
        prompt = cfg["prompt_len"] if cfg["prompt_len"] is not None else cfg["block_size"] // 2
        new = cfg["new_tokens"]
        if type(prompt) is not int or prompt < 1 or type(new) is not int or new < 1 \
                or prompt + new > cfg["block_size"]:
            raise ConfigError(f"decode needs prompt_len >= 1, new_tokens >= 1 and prompt_len + new_tokens <= "
                              f"block_size ({cfg['block_size']}), got prompt_len={prompt!r}, "
                              f"new_tokens={cfg['new_tokens']!r}")


def validate_pipeline(cfg, tp):
    """mode='pipeline': under torchrun, one replica, and every (schedule,
    micro-batch count) a valid layout."""
    for key in ("pp_schedules", "microbatches"):
        if not isinstance(cfg[key], list) or not cfg[key]:
            raise ConfigError(f"{key} must be a non-empty list, got {cfg[key]!r}")
    for schedule in cfg["pp_schedules"]:
        for m in cfg["microbatches"]:
            validate_pp_layout(world=world_size(), pp_size=cfg["pp_size"], tp=tp, n_layer=cfg["n_layer"],
                               schedule=schedule, n_microbatches=m, keys=dict(
                                            schedule="pp_schedules", n_microbatches="microbatches",
                                            virtual_stages="pp_virtual_stages"),
                                        virtual_stages=cfg["pp_virtual_stages"]
                               if schedule == "interleaved_1f1b"
                                        else 1)


def check_models(cfg):
    """The models this run times (tpcomm/model/options.py): each pattern with each variant, or GPT."""
    if cfg["model_type"] != "distributed_gpt":
        if cfg["variants"] is not None or cfg["patterns"] is not None:
            key = "variants" if cfg["variants"] is not None else "patterns"
            raise ConfigError(f"{key} need model_type='distributed_gpt', got "
                              f"model_type={cfg['model_type']!r}")
        model_config(cfg["model_type"], cfg, tp_mode=cfg["tp_mode"])
        return
    if cfg["patterns"] is not None and (cfg["block_types"] is not None
                                        or not isinstance(cfg["patterns"], list)):
        raise ConfigError(f"patterns must be a list of block_types values, given instead of block_types; got "
                          f"patterns={cfg['patterns']!r}, block_types={cfg['block_types']!r}")
    for block_types in cfg["patterns"] or [cfg["block_types"]]:
        validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                         tp_size=cfg["tp_size"], block_types=block_types)
    combinations(cfg)  # ConfigError when a variant runs with no pattern


def variants_of(cfg):
    """The variants to time: a list of dicts of TP_COMM_OPTIONS (ConfigError naming the bad one)."""
    variants = cfg["variants"] if cfg["variants"] is not None else [{}]
    if not isinstance(variants, list) or not variants or not all(isinstance(v, dict) for v in variants):
        raise ConfigError(f"variants must be a non-empty list of dicts, got {variants!r}")
    for v in variants:
        bad = sorted(set(v) - set(TP_COMM_OPTIONS))
        if bad:
            raise ConfigError(f"variants: unknown key(s) {bad} in {v!r}; use {list(TP_COMM_OPTIONS)}")
        for key, value in v.items():  # the type of the flag's default (tp_comm_dtype: a name or None)
            default = TP_DEFAULTS[key]
            if not (type(value) is type(default) or (key == "tp_comm_dtype" and isinstance(value, str))):
                want = "a str or None" if default is None else type(default).__name__
                raise ConfigError(f"variants: {key} must be {want}, got {value!r} in {v!r}")
    return variants


def combinations(cfg):
    """([(block_types, variant)] to time, [a note per pair that does not run, e.g. 'ladder'
    with SP]); ConfigError naming a variant that runs with no pattern (a bad value, or a
    setting nothing here can use)."""
    runs, skipped, refused = [], [], {}
    patterns, variants = cfg["patterns"] or [cfg["block_types"]], variants_of(cfg)
    for block_types in patterns:
        for i, variant in enumerate(variants):
            try:
                check_variant(cfg, block_types, variant)
                runs.append((block_types, variant))
            except ConfigError as e:
                refused.setdefault(i, []).append(e)
                skipped.append(f"skipped "
                               f"{pattern_label(block_types)}{variant_name(sync_options(cfg, variant))}: {e}")
    for i, errors in refused.items():
        # runs with no pattern: a bad value, or a setting nothing here can use
        if len(errors) == len(patterns):
            if cfg["variants"] is None:  # the flags as given
                raise errors[0]
            raise ConfigError(f"variants: {variants[i]!r} runs with no pattern: {errors[0]}")
    return runs, skipped


def check_variant(cfg, block_types, variant):
    """The model config of one pattern and variant (the flags, changed by the variant), checked as train.py
    checks its own (tpcomm/model/options.py)."""
    config = model_config("distributed_gpt", dict(cfg, block_types=block_types, **variant),
                          tp_mode=cfg["tp_mode"])
    check_batch(config, batch_size=cfg["batch_size"], block_size=cfg["block_size"])
    return config


def sync_options(cfg, variant):
    """The TP_COMM_OPTIONS a variant's rows run with: the flags, changed by the variant."""
    return {**{k: cfg[k] for k in TP_COMM_OPTIONS}, **variant}


def variant_name(variant):
    """'' for the default; else ' +overlap2', ' +sp', ' +int8/32' (dtype/values per scale; ' +int8/32 2shot'
    with tp_comm_exchange='two_shot'), ' +sp +ring' (tp_collective_matmul), joined."""
    parts = []
    if variant.get("tp_overlap", 1) > 1:
        parts.append(f"overlap{variant['tp_overlap']}")
    if variant.get("tp_async_grad"):
        parts.append("async-grad")
    if variant.get("sequence_parallel"):
        parts.append("sp")
    if variant.get("tp_collective_matmul"):
        parts.append("ring")
    if variant.get("tp_comm_dtype"):
        two = " 2shot" if variant.get("tp_comm_exchange") == "two_shot" else ""
        parts.append(f"{variant['tp_comm_dtype']}/{variant.get('tp_comm_block', 32)}{two}")
    return "".join(f" +{p}" for p in parts)


def pattern_label(block_types):
    """'distributed_gpt' for a single default model; a short label per pattern:
    'spd', ['parallel','spd']*6."""
    if block_types is None or isinstance(block_types, str):
        return "distributed_gpt" if block_types is None else block_types
    return compact_list(block_types)
