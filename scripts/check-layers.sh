#!/usr/bin/env bash
# Fails when a module imports from a module the layout does not allow it
# to: the layers inside the library crate (shared/), and the module rules
# inside the ingest and worker crates. Rust itself accepts a cycle inside a
# crate, so this is its only guard. The crates' own boundaries (ingest
# never uses worker, nor the reverse) are the compiler's: neither lists the
# other as a dependency.
#
# It reads every `crate::` path (and `super::` at a crate's top level) in
# code, above any `#[cfg(test)]` module, and checks each edge against the
# tables below, which shared/src/lib.rs, ingest/src/lib.rs and
# worker/src/lib.rs describe in words.
#
#   scripts/check-layers.sh          # exit 0, or 1 with every bad edge
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import pathlib, re, sys

NOUNS = {"key", "signature", "payload", "metrics", "telemetry", "shutdown", "failpoints"}
ALLOWED = {
    "shared": {
        # layer 0, nouns: nothing of this crate
        **{m: set() for m in NOUNS},
        "job": {"key"},                                       # 1 message
        "postgres": set(),                                    # 1 adapter
        "deliveries": {"key", "job", "postgres"},             # 2 state machine
        "retry": {"deliveries"},                              # 3 policy
        "broker": {"key", "job", "deliveries"},               # 3 adapter
        "config": NOUNS | {"job", "postgres", "deliveries", "retry", "broker"},  # 4 settings
    },
    "ingest": {
        "startup": {"receive", "rotation", "limits"},
        "receive": {"answer", "body", "rotation", "limits"},
        "limits": {"answer"},
        "answer": set(),
        "body": {"answer"},
        "rotation": set(),
    },
    "worker": {
        "cli": {"runtime", "ops", "handlers", "reconcile", "admin"},
        "runtime": {"handlers", "maintenance", "reconcile", "context"},
        "maintenance": {"context"},
        "ops": {"maintenance", "context"},
        "admin": {"ops", "reconcile"},
        "handlers": set(),
        "reconcile": set(),
        "context": set(),
    },
}

def top_names(text):
    """The first path segment of every `crate::` path in `text`."""
    names = []
    for m in re.finditer(r"(?<![\w$])crate::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            depth, seg = 0, ""
            for ch in rest:
                if ch == "{":
                    depth += 1
                    if depth == 1:
                        continue
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        break
                if depth == 1 and ch == ",":
                    names.append(seg.strip().split("::")[0]); seg = ""
                else:
                    seg += ch
            if seg.strip():
                names.append(seg.strip().split("::")[0])
        else:
            word = re.match(r"\w+", rest)
            if word:
                names.append(word.group(0))
    return [n for n in names if n and n != "self"]

def code(path):
    """The file's code lines, without comments, above its test module."""
    lines = []
    for line in path.read_text().splitlines():
        if line.strip().startswith("#[cfg(test)]"):
            break
        stripped = line.split("//")[0] if "//" in line and '"' not in line.split("//")[0] else line
        if stripped.lstrip().startswith("//"):
            continue
        lines.append(stripped)
    return "\n".join(lines)

bad = []
for crate, table in ALLOWED.items():
    src = pathlib.Path(crate) / "src"
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if rel.parts[0] in ("lib.rs", "main.rs"):
            continue
        module = rel.parts[0].removesuffix(".rs")
        if module not in table:
            bad.append(f"{path}: module '{module}' is not in the table of {crate}; add it to scripts/check-layers.sh")
            continue
        text = code(path)
        used = top_names(text)
        # At a crate's top level (src/x.rs, src/x/mod.rs) `super::` is the crate.
        if len(rel.parts) == 1 or rel.name == "mod.rs":
            used += [m.group(1) for m in re.finditer(r"(?<![\w$])super::(\w+)", text)]
        for target in sorted(set(used)):
            if target == module or target not in table:
                continue  # itself, or a crate-root re-export
            if target not in table[module]:
                bad.append(f"{path}: {crate}::{module} may not import {crate}::{target}")
if bad:
    print("Import edges the layout does not allow:")
    for line in bad:
        print("  " + line)
    sys.exit(1)
print("layers ok: every crate:: import follows the allowed directions")
PY
