#!/usr/bin/env bash
# Stage the wheels a device call needs (the device has no network; one call carries at most 64 MiB):
#
#   bash benchmarks/stage_wheels.sh base   pydantic and its parts into .whl/ (the device image lacks pydantic)
#   bash benchmarks/stage_wheels.sh fa4    FlashAttention-4's wheels (~105 MB) into .fa4/wheels/, then split into
#                                          two carry sets .fa4/a and .fa4/b of under $LIMIT_MIB MiB each
#   WHEELS=DIR bash benchmarks/stage_wheels.sh split   only the split, of wheels already in DIR
#   bash benchmarks/stage_wheels.sh peers  the two peers that both import as dilated_attention_pytorch, each in its
#                                          own folder: .peers/fkodom (fkodom's 0.2.0 wheel and xformers 0.0.35:
#                                          its pinned xformers < 0.0.22 has no wheel for Python 3.12) and .peers/seed
#                                          (torchscale 0.3.0 and the seed project's package from git, SEED_REPO=a
#                                          local clone or a git directory, else cloned from GitHub), ~3.5 MiB
#
# Wheels are fetched with `pip download --no-deps` for the device's Python (3.12, /work/.library/device/KINDS.md)
# on manylinux x86_64; each one's version pin is read from the Requires-Dist of the wheels fetched before it
# (flash-attn-4 first), so the set is the one flash-attn-4 asks for. The largest wheel is cut with `split`; the
# parts go to both sets with a sha256 manifest, and gpu_run.sh's fa4_install step re-joins and checks them.
# Everything lands in git-ignored folders: nothing here is committed.
set -eu
LIMIT_MIB=${LIMIT_MIB:-54}  # a call carries 64 MiB with the tracked tree (~4 MiB) and .whl/ (~3 MiB)
PY=${PYTHON_VERSION:-3.12}
PIP=${PIP:-python -m pip}
FA4_PACKAGES=${FA4_PACKAGES:-"flash-attn-4 nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-cu13 apache-tvm-ffi torch-c-dlpack-ext quack-kernels"}
BASE_PACKAGES=${BASE_PACKAGES:-"pydantic pydantic-core annotated-types typing-inspection"}
PLATFORMS=$(for n in 1 2014 _2_17 _2_24 _2_27 _2_28 _2_31 _2_34 _2_35; do printf -- "--platform manylinux%s_x86_64 " "$n"; done)

pinned() {   # pinned NAME DIR: NAME with the specifier a wheel already in DIR requires of it (else NAME)
  python - "$1" "$2" <<'EOF'
import re, sys, zipfile, pathlib
name, folder = sys.argv[1], pathlib.Path(sys.argv[2])
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
for wheel in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                req = line.split(":", 1)[1].split(";")[0].strip()
                m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*\(?([^)]*)\)?", req)
                if m and norm(m.group(1)) == norm(name) and m.group(3).strip():
                    print(name + m.group(3).replace(" ", "")); sys.exit()
print(name)
EOF
}

download() {   # download DIR PACKAGE...
  local dir=$1; shift; mkdir -p "$dir"
  for package in "$@"; do
    local pre=""; [ "$package" = flash-attn-4 ] && pre=--pre   # flash-attn-4 has beta releases only
    # shellcheck disable=SC2086
    $PIP download -q $pre --no-deps --only-binary=:all: --python-version "$PY" --implementation cp $PLATFORMS \
      -d "$dir" "$(pinned "$package" "$dir")"
  done
  ls -l "$dir"
}

split_sets() {   # split_sets DIR: .fa4/a and .fa4/b, each under LIMIT_MIB, the largest wheel cut in two parts
  local dir=$1 limit=$((LIMIT_MIB * 1024 * 1024))
  rm -rf .fa4/a .fa4/b; mkdir -p .fa4/a .fa4/b
  (cd "$dir" && sha256sum ./*.whl) > .fa4/b/manifest.sha256
  local largest; largest=$(ls -S "$dir"/*.whl | head -1)
  local used_a=0 used_b=0 size
  for wheel in $(ls -S "$dir"/*.whl | tail -n +2); do
    size=$(stat -c %s "$wheel")
    if [ $((used_a + size)) -le $((used_b + size)) ]; then cp "$wheel" .fa4/a/; used_a=$((used_a + size))
    else cp "$wheel" .fa4/b/; used_b=$((used_b + size)); fi
  done
  size=$(stat -c %s "$largest")
  local room=$((limit - used_a - 65536))
  [ "$room" -gt 0 ] || { echo "set a is full before the largest wheel" >&2; exit 1; }
  split -b "$room" -d -a 2 "$largest" ".fa4/parts.$(basename "$largest")."
  local parts=(.fa4/parts.*); mv "${parts[0]}" .fa4/a/; mv "${parts[@]:1}" .fa4/b/
  for set in a b; do
    local total; total=$(du -sb .fa4/$set | cut -f1)
    echo "carry set .fa4/$set: $(awk "BEGIN{printf \"%.1f\", $total/1048576}") MiB ($(ls .fa4/$set | wc -l) files)"
    [ "$total" -lt "$limit" ] || { echo ".fa4/$set is over ${LIMIT_MIB} MiB: raise LIMIT_MIB or drop a wheel" >&2; exit 1; }
  done
}

SEED_URL=https://github.com/DarcStar-Solutions-Tech/dilated-attention-pytorch
stage_peers() {   # .peers/fkodom and .peers/seed: wheels to install with --target, the seed's package as source
  rm -rf .peers && mkdir -p .peers/fkodom .peers/seed
  $PIP download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp $PLATFORMS \
    --platform any -d .peers/fkodom dilated-attention-pytorch==0.2.0 xformers==0.0.35
  $PIP download -q --no-deps --only-binary=:all: -d .peers/seed torchscale==0.3.0
  local repo=${SEED_REPO:-}
  if [ -z "$repo" ]; then repo=$(mktemp -d) && git clone -q --depth 1 "$SEED_URL" "$repo"; fi
  local git="git -C $repo"; [ -d "$repo/objects" ] && git="git --git-dir=$repo"
  for f in $($git ls-tree -r --name-only HEAD dilated_attention_pytorch); do   # file by file: some blobs of the
    mkdir -p ".peers/seed/src/$(dirname "$f")" && $git show "HEAD:$f" > ".peers/seed/src/$f"   # repo are LFS-sized
  done
  $git rev-parse HEAD > .peers/seed/COMMIT
  du -sh .peers; ls -R .peers | head -20
}

case "${1:-fa4}" in
  base) download .whl $BASE_PACKAGES ;;
  fa4) download .fa4/wheels $FA4_PACKAGES; split_sets .fa4/wheels ;;
  split) split_sets "${WHEELS:?WHEELS=DIR of wheels to split}" ;;
  peers) stage_peers ;;
  *) echo "usage: stage_wheels.sh base|fa4|split|peers" >&2; exit 2 ;;
esac
