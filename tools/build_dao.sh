#!/usr/bin/env bash
# Build Dao-AILab causal-conv1d 1.7.0, a PEER of the benchmarks (not a dependency), for sm_90 on the GPU machine.
#   bash tools/build_dao.sh        (device_run.sh's `peers` runs it in the background; its benchmark steps wait for it)
# Result: $DAO_DIR/causal_conv1d-1.7.0 (put it on PYTHONPATH) holding causal_conv1d/ and causal_conv1d_cuda*.so,
# then the file DONE there (or FAILED, with build.log). The steps:
#   1. the source package: $DAO_SDIST, else .fla/, shared/peers/ or ../shared/peers/causal_conv1d-1.7.0.tar.gz
#      (the GPU machine gets only the repository: copy the tarball into the git-ignored .fla/ and carry .fla);
#   2. a prebuilt copy, when there is one ($DAO_PREBUILT, default .fla/dao_prebuilt_sm90.tgz, written by an earlier
#      build into $OUT): unpacked and import-tested instead of building (seconds);
#   3. otherwise setup.py build_ext --inplace with CAUSAL_CONV1D_FORCE_BUILD=TRUE, Hopper only (the peers README's
#      sed), for the x dtypes DAO_X (default "bf16 fp32") times the weight dtypes DAO_W (default "fp32 bf16"):
#      mixed-precision training (bf16 x, fp32 weight), a bf16 model and an fp32 one; "fp16" adds half. Each .cu
#      file is split into one translation unit per dtype pair (the file with the other pairs' explicit
#      instantiations dropped; the kernels are unchanged), so that the pairs compile in parallel (DAO_JOBS,
#      default 16), and the dtype dispatch raises for the types not built.
#   4. on success, with $OUT set, the built package is packed into $OUT/dao_prebuilt_sm90.tgz for step 2 next time.
set -u
if [ -n "${OUT:-}" ]; then OUT=$(cd "$OUT" 2>/dev/null && pwd) || OUT=""; fi  # absolute: the build cds into its tree
DAO_DIR=${DAO_DIR:-/tmp/dao}
SRC=$DAO_DIR/causal_conv1d-1.7.0
LOG=$DAO_DIR/build.log
mkdir -p "$DAO_DIR"
rm -f "$SRC/DONE" "$SRC/FAILED" "$DAO_DIR/DONE" "$DAO_DIR/FAILED"
exec >"$LOG" 2>&1
t0=$(date +%s)
fail() { echo "FAILED: $*"; mkdir -p "$SRC"; touch "$SRC/FAILED" "$DAO_DIR/FAILED"; exit 1; }
import_ok() { (cd /tmp && PYTHONPATH="$SRC" python3 -c "import torch, causal_conv1d_cuda; from causal_conv1d import causal_conv1d_fn; print('import ok')"); }

PRE=${DAO_PREBUILT:-.fla/dao_prebuilt_sm90.tgz}
if [ -f "$PRE" ]; then
  echo "unpacking prebuilt $PRE"
  rm -rf "$SRC" && mkdir -p "$DAO_DIR" && tar -xzf "$PRE" -C "$DAO_DIR" || fail "unpack $PRE"
  if import_ok; then touch "$SRC/DONE" "$DAO_DIR/DONE"; echo "prebuilt ok in $(( $(date +%s) - t0 )) s"; exit 0; fi
  echo "prebuilt does not import here (other torch/python?): building"
fi

SDIST=${DAO_SDIST:-}
for c in .fla/causal_conv1d-1.7.0.tar.gz shared/peers/causal_conv1d-1.7.0.tar.gz ../shared/peers/causal_conv1d-1.7.0.tar.gz; do
  [ -z "$SDIST" ] && [ -f "$c" ] && SDIST=$c
done
[ -n "$SDIST" ] || fail "no causal_conv1d-1.7.0.tar.gz (set DAO_SDIST, or copy it into .fla/ and carry .fla)"
rm -rf "$SRC" && tar -xzf "$SDIST" -C "$DAO_DIR" || fail "untar $SDIST"
cd "$SRC" || fail "no $SRC"
# Hopper only (the default list compiles ten architectures)
sed -i 's/^\(\s*\)# HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI/\1cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]\n&/' setup.py
grep -q 'arch=compute_90,code=sm_90"]' setup.py || fail "setup.py patch (sm_90 only) did not apply"
DAO_X=${DAO_X:-bf16 fp32} DAO_W=${DAO_W:-fp32 bf16} python3 - <<'PY' || fail "dtype-pair split"
import itertools, os, pathlib, re
TYPES = {"fp32": ("float", "Float"), "fp16": ("at::Half", "Half"), "bf16": ("at::BFloat16", "BFloat16")}
xs, ws = os.environ["DAO_X"].split(), os.environ["DAO_W"].split()
assert xs and ws and set(xs + ws) <= set(TYPES), (xs, ws)
sources = []
for stem in ("causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update"):
    original = pathlib.Path("csrc/%s.cu" % stem)
    lines = original.read_text().splitlines(keepends=True)
    for x, w in itertools.product(xs, ws):
        pair = "<%s, %s>" % (TYPES[x][0], TYPES[w][0])
        kept = [l for l in lines if not l.startswith("template void ") or pair in l]
        assert sum(l.startswith("template void ") for l in kept) >= 1, (stem, pair)
        unit = pathlib.Path("csrc/%s_%s_%s.cu" % (stem, x, w))
        unit.write_text("".join(kept))
        sources.append('"%s"' % unit)
setup = pathlib.Path("setup.py")
text = setup.read_text()
listed = re.compile(r'\n(\s*)"csrc/causal_conv1d_fwd\.cu",\n\s*"csrc/causal_conv1d_bwd\.cu",\n\s*"csrc/causal_conv1d_update\.cu",\n')
m = listed.search(text)
assert m, "setup.py's sources list"
indent = m.group(1)
text = text[:m.start()] + "\n" + "".join("%s%s,\n" % (indent, src) for src in sources) + text[m.end():]
setup.write_text(text)
cpp = pathlib.Path("csrc/causal_conv1d.cpp")
s = cpp.read_text()
def dispatch(macro, var, names):
    global s
    pat = re.compile(r"#define %s\((\w+), NAME, \.\.\.\)[^\n]*\n(?:[^\n]*\\\n)*[^\n]*\n" % macro)
    m = pat.search(s)
    assert m, macro
    arg = m.group(1)
    body = "#define %s(%s, NAME, ...) \\\n    " % (macro, arg)
    for name in names:
        typ, scalar = TYPES[name]
        body += "if (%s == at::ScalarType::%s) { \\\n        using %s = %s; \\\n        __VA_ARGS__(); \\\n    } else " % (
            arg, scalar, var, typ)
    body += ("{ \\\n        AT_ERROR(#NAME, \" not built for type '\", toString(%s), \"' (tools/build_dao.sh: "
             "x %s, weight %s)\"); \\\n    }\n") % (arg, "/".join(xs), "/".join(ws))
    s = s[:m.start()] + body + s[m.end():]
dispatch("DISPATCH_ITYPE_FLOAT_AND_HALF_AND_BF16", "input_t", xs)
dispatch("DISPATCH_WTYPE_FLOAT_AND_HALF_AND_BF16", "weight_t", ws)
cpp.write_text(s)
print("x %s, weight %s: %d translation units" % ("/".join(xs), "/".join(ws), len(sources)))
PY
echo "building with MAX_JOBS=${DAO_JOBS:-16} (nvcc $(nvcc --version | tail -1))"
MAX_JOBS=${DAO_JOBS:-16} CAUSAL_CONV1D_FORCE_BUILD=TRUE python3 setup.py build_ext --inplace || fail "build_ext"
import_ok || fail "import after build"
touch "$SRC/DONE" "$DAO_DIR/DONE"
echo "built in $(( $(date +%s) - t0 )) s"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  tar -czf "$OUT/dao_prebuilt_sm90.tgz" -C "$DAO_DIR" --exclude build --exclude csrc --exclude tests --exclude DONE --exclude FAILED causal_conv1d-1.7.0 \
    && echo "packed $OUT/dao_prebuilt_sm90.tgz ($(du -h "$OUT/dao_prebuilt_sm90.tgz" | cut -f1)): copy it into .fla/ to skip the build next time"
fi
