"""Review mode against direct mode on two builds (bench/run's review section): `npm ci --offline`
of a project whose dependencies are local package tarballs, and `cargo build --offline` of a
small crate, each timed inside the sandbox, rounds interleaved in alternating order, median per
mode. What a round removes first (node_modules, target) is removed before the clock starts.

Usage (as the sandbox user): review_build.py WORK AI_SANDBOX ROUNDS RUST_TOOLCHAIN
Prints one JSON object: npm_d, npm_r, cargo_d, cargo_r (seconds).
"""

import glob
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile

work, aisb, rounds, rust = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
PACKAGES, FILES = 100, 10


def npm_project(root):
    """A project depending on PACKAGES tarballs in it (tgz/), each of FILES small files."""
    os.makedirs(f"{root}/tgz", exist_ok=True)
    deps = {}
    for p in range(PACKAGES):
        name = f"bench-pkg-{p}"
        with tarfile.open(f"{root}/tgz/{name}-1.0.0.tgz", "w:gz") as t:
            files = {"package.json": json.dumps({"name": name, "version": "1.0.0", "main": "index.js"})}
            files["index.js"] = "module.exports = require('./lib0.js');\n"
            for f in range(FILES - 2):
                files[f"lib{f}.js"] = f"module.exports = {{ n: {p * 100 + f}, s: '{'x' * 200}' }};\n"
            for fname, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(f"package/{fname}")
                info.size, info.mode = len(data), 0o644
                t.addfile(info, io.BytesIO(data))
        deps[name] = f"file:tgz/{name}-1.0.0.tgz"
    with open(f"{root}/package.json", "w") as f:
        json.dump({"name": "bench-app", "version": "1.0.0", "dependencies": deps}, f)
    # The lock file `npm ci` needs, made once on the host.
    subprocess.run(["npm", "install", "--offline", "--no-audit", "--no-fund", "--loglevel=error"], cwd=root, check=True,
                   capture_output=True)
    subprocess.run(["rm", "-rf", f"{root}/node_modules"], check=True)


def cargo_project(root):
    """A crate of 40 modules, no dependencies."""
    os.makedirs(f"{root}/src", exist_ok=True)
    with open(f"{root}/Cargo.toml", "w") as f:
        f.write('[package]\nname = "benchcrate"\nversion = "0.1.0"\nedition = "2021"\n')
    mods = []
    for m in range(40):
        mods.append(f"pub mod m{m};")
        with open(f"{root}/src/m{m}.rs", "w") as f:
            for i in range(20):
                f.write(f"pub fn f{i}(v: &[u64]) -> u64 {{ v.iter().map(|x| x.wrapping_mul({i + m} + 1)).sum() }}\n")
    with open(f"{root}/src/lib.rs", "w") as f:
        f.write("\n".join(mods) + "\n")


def inside(proj, extra, script, before):
    """The time `script` took inside a sandbox on `proj`, in seconds (after `before`)."""
    cmd = f"{before} >/dev/null 2>&1; s=$(date +%s%N); {script} >/dev/null; e=$(date +%s%N); echo $((e-s))"
    out = subprocess.run([aisb, "--net", "none", "--project", proj, *extra, "--", "sh", "-c", cmd], check=True,
                         capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1e9


def discard(proj):
    name = os.path.basename(proj)
    for d in glob.glob(os.path.expanduser(f"~/.local/state/ai-sandbox/projects/{name}-*/reviews/*")):
        subprocess.run([aisb, "discard", "--project", proj, os.path.basename(d)], check=True, capture_output=True)


npm, cargo = f"{work}/rnpm", f"{work}/rcargo"
npm_project(npm)
cargo_project(cargo)
builds = {
    "npm": (npm, "npm ci --offline --no-audit --no-fund --loglevel=error", "rm -rf node_modules"),
    "cargo": (cargo, f"RUSTC={rust}/bin/rustc {rust}/bin/cargo build --offline -q", "rm -rf target"),
}
t = {f"{k}_{m}": [] for k in builds for m in "dr"}
for i in range(rounds + 1):
    order = [("d", []), ("r", ["--review"])] if i % 2 else [("r", ["--review"]), ("d", [])]
    for k, (proj, script, before) in builds.items():
        for m, extra in order:
            took = inside(proj, extra, script, before)
            discard(proj)
            if i:  # the first round warms the page cache
                t[f"{k}_{m}"].append(took)
print(json.dumps({k: statistics.median(v) for k, v in t.items()}))
