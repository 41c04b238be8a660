"""
Which code wrote each result file, and whether a row's files (and the baseline it is paired with) come
from one code state. A result file records the git commit its run started from and whether tracked files
outside experiments/ had uncommitted changes ("dirty": the code behind it cannot be named). The sweep
writes committed result files only from a clean tree; `--allow-dirty` writes scratch files (git
"scratch": true) under experiments/scratch/, which the report refuses (sweep_records.check_code_state,
where result files are loaded).

A row whose files span several clean commits, or a row paired with a baseline from another commit, is one
code state for its math only when a rerun shows it: a rerun check is a result file in
experiments/<sweep>/reruns/, the same run and seed as a file in runs/, trained again at another clean
commit; its final val loss must equal the old one to RERUN_DECIMALS decimals. The report prints every
row's commits and these checks (provenance_markdown).

    rerun_checks("cpu-long")          # [{"run", "seed", "old", "new", "old_loss", "new_loss", "equal"}]
    provenance_markdown(ctx, "cpu-long")
"""

import glob
import os
from collections import Counter

from tpcomm import ROOT
from tpcomm.experiments import results
from tpcomm.experiments.result_check import ResultsError
from tpcomm.experiments.sweep_records import check_code_state, ignored_by_git, load_result

RERUN_DECIMALS = 4  # a rerun equals its old file when their final val losses agree to 4 decimals


def code_state(record):
    """'ff85d59' (a clean commit), 'fb4df38+dirty' (uncommitted changes: unnamed
    code) or 'unknown' (no git)."""
    git = record.get("git")
    if not isinstance(git, dict) or not git.get("commit"):
        return "unknown"
    return git["commit"][:7] + ("+dirty" if git.get("dirty") else "")


def is_named(state):
    return state not in ("unknown",) and not state.endswith("+dirty")


def rerun_checks(sweep, *, root=ROOT):
    """Each rerun file in experiments/<sweep>/reruns/ against the file of the same name in runs/: the commits,
    the two final val losses and whether they agree to RERUN_DECIMALS decimals. A rerun without its old file,
    from a dirty tree, a scratch file or a file git ignores is a ResultsError naming it."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, "experiments", sweep, "reruns", "*.json"))):
        if ignored_by_git(path):
            raise ResultsError(f"{path}: git ignores this rerun check (.gitignore), so a clean clone would "
                               "not have " f"it: un-ignore it and commit it")
        new = results.read_record(path)
        check_code_state(new, path)
        old_path = os.path.join(root, "experiments", sweep, "runs", os.path.basename(path))
        if not os.path.exists(old_path):
            raise ResultsError(f"{path}: a rerun check needs the file it reruns, {old_path}")
        old = results.read_record(old_path)
        if (new["run"], new["seed"]) != (old["run"], old["seed"]):
            raise ResultsError(f"{path}: reruns {new['run']} seed {new['seed']}, but {old_path} holds "
                                       f"{old['run']} seed {old['seed']}")
        if not is_named(code_state(new)):
            raise ResultsError(f"{path}: a rerun check must come from a clean commit, got "
                                       f"{code_state(new)}")
        out.append(dict(run=new["run"], seed=new["seed"], old=code_state(old), new=code_state(new),
                        old_loss=old["val_loss"], new_loss=new["val_loss"],
                        equal=round(old["val_loss"], RERUN_DECIMALS) == round(new["val_loss"],
                                                                              RERUN_DECIMALS)))
    return out


def verified(run, old, new, checks):
    """A passing rerun check shows run's math at commit old equals its math at new (either direction)."""
    return any(c["run"] == run and c["equal"] and {c["old"], c["new"]} == {old, new} for c in checks)


def row_verdict(run, states, base_run, base_states, checks):
    """What a row's code states say: files from a dirty tree (unnamed code), several named states (each extra
    one shown equal by a rerun, or not), and, for a row paired with a baseline from other commits, whether a
    rerun of the baseline bridges them. Flags are in bold; 'one code state' when there is none."""
    said = []
    unnamed = sum(c for s, c in states.items() if not is_named(s))
    if unnamed:
        said.append(f"**from unnamed code until rerun** ({unnamed} of {sum(states.values())} files from a "
                    "dirty tree)")
    # the most files' state first
    named = [s for s in sorted(states, key=lambda s: -states[s]) if is_named(s)]
    unverified = [s for s in named[1:] if not verified(run, s, named[0], checks)]
    if unverified:
        said.append(f"**mixes {len(named)} code states** (no rerun shows {', '.join(unverified)} equal to "
                    f"{named[0]})")
    elif named[1:]:
        said.append(f"{len(named)} commits, shown equal by rerun")
    said = said or ["one code state"]
    named_base = [s for s in base_states if is_named(s)]
    if base_run not in (None, run) and named_base:
        own = named[:1] + unverified  # a state shown equal to the row's main one pairs as that one
        missing = [s for s in own if s not in named_base and
                   not any(verified(base_run, b, s, checks) for b in named_base)]
        if missing:
            said.append(f"**paired with {base_run} across code states** ({', '.join(missing)} against "
                        f"{', '.join(named_base)}, no rerun of {base_run} there)")
        elif any(s not in named_base for s in own):
            said.append(f"paired with {base_run} across code states, bridged by a rerun")
    return "; ".join(said)


def states_of(ctx, name):
    """({run name: Counter of code states} of a sweep's committed result files (report.Results ctx), shared
    runs included, and the names of its own runs)."""
    out, own = {}, set()
    for j in ctx.jobs(name):
        record = load_result(j, say=lambda *_: None)
        if record is not None:
            out.setdefault(j.run.name, Counter())[code_state(record)] += 1
            own |= {j.run.name} if j.sweep == name else set()
    return out, own


def provenance_markdown(ctx, name):
    """Each row's commits (files per commit) and what they say, and the sweep's rerun checks."""
    states, own = states_of(ctx, name)
    if not states:
        return f"_No result files yet for `{name}`._"
    rows = {r["config"]: r for r in ctx.rows(name)}
    checks = rerun_checks(name, root=ctx.root)
    shared = sorted(set(states) - own)
    lines = [f"The code behind each row of `{name}`: the commit each result file's run started from (files), "
             f"`+dirty` where the tree had uncommitted changes (the code cannot be "
             "named)" + (f"; its shared runs ({', '.join(shared)}) are in `cpu-long`'s "
                         "table" if shared else "") + ".", "", "| config | commits (files) | code state |",
             "|---|---|---|"]
    for run, st in ((r, s) for r, s in states.items() if r in own):
        base = rows[run]["baseline"] if run in rows else None
        verdict = row_verdict(run, st, base, states.get(base, Counter()), checks)
        lines.append(f"| {run} | {', '.join(f'{s} ({n})' for s, n in st.most_common())} | {verdict} |")
    if checks:
        lines += ["", f"Rerun checks (experiments/{name}/reruns/: the same run and seed trained again at "
                  "another " f"commit; equal when the final val losses agree to {RERUN_DECIMALS} decimals):",
                  "", "| run | seed | old commit | val loss | rerun commit | val loss | equal |",
                  "|---|---:|---|---:|---|---:|---|"]
        lines += [f"| {c['run']} | {c['seed']} | {c['old']} | {c['old_loss']:.6f} | {c['new']} | "
                  f"{c['new_loss']:.6f} | {'yes' if c['equal'] else '**NO**'} |" for c in checks]
    else:
        lines += ["", f"No rerun checks yet (experiments/{name}/reruns/)."]
    return "\n".join(lines)


def flagged_rows(ctx, name):
    """The sweep's own rows whose code state is flagged (row_verdict), and its own rows."""
    states, own = states_of(ctx, name)
    base = {r["config"]: r["baseline"] for r in ctx.rows(name)}
    checks = rerun_checks(name, root=ctx.root)
    return [run for run in own if "**" in row_verdict(run, states[run], base.get(run),
                                                      states.get(base.get(run), Counter()), checks)], own


def summary(ctx, name):
    """One clause for the README's answer: how many rows come from one code state,
    and how many are flagged."""
    flagged, own = flagged_rows(ctx, name)
    return (f"code: {len(own) - len(flagged)} of {len(own)} rows from one named code state" +
            (f", {len(flagged)} flagged (mixed or unnamed code: docs/axes.md, `{name}`'s code table)"
             if flagged else ""))
