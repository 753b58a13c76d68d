#!/usr/bin/env bash
# Build Dao-AILab causal-conv1d 1.7.0, a PEER of the benchmarks (not a dependency), for sm_90 on the GPU machine.
#   bash benchmarks/tools/build_dao.sh        (device_run.sh's `daobuild` runs it in the background; `waitdao` waits)
# Result: $DAO_DIR/causal_conv1d-1.7.0 (put it on PYTHONPATH) holding causal_conv1d/ and causal_conv1d_cuda*.so,
# then the file DONE there (or FAILED, with build.log). The steps:
#   1. the source package: $DAO_SDIST, else .fla/, shared/peers/ or ../shared/peers/causal_conv1d-1.7.0.tar.gz
#      (the GPU machine gets only the repository: copy the tarball into the git-ignored .fla/ and carry .fla);
#   2. a prebuilt copy, when there is one ($DAO_PREBUILT, default .fla/dao_prebuilt_sm90.tgz, written by an earlier
#      build into $OUT): unpacked and import-tested instead of building (seconds);
#   3. otherwise setup.py build_ext --inplace with CAUSAL_CONV1D_FORCE_BUILD=TRUE, Hopper only (the peers README's
#      sed), and with DAO_TRIM=1 (default) only the bf16-input / fp32-weight kernels the benchmarks call: the other
#      8 dtype pairs' explicit instantiations are dropped and the dtype dispatch raises for them (the kernels of
#      the pair that is kept are unchanged); DAO_TRIM=0 builds all 9 pairs (about 6 minutes with 8 jobs).
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
if [ "${DAO_TRIM:-1}" = 1 ]; then
  python3 - <<'PY' || fail "trim patch"
import re, pathlib
keep = "<at::BFloat16, float>"
for name in ("csrc/causal_conv1d_fwd.cu", "csrc/causal_conv1d_bwd.cu", "csrc/causal_conv1d_update.cu"):
    p = pathlib.Path(name)
    lines = p.read_text().splitlines(keepends=True)
    out = [l for l in lines if not (l.startswith("template void ") and keep not in l)]
    assert sum(l.startswith("template void ") for l in out) >= 1, name
    p.write_text("".join(out))
p = pathlib.Path("csrc/causal_conv1d.cpp")
s = p.read_text()
def only(macro, var, typ, scalar):
    global s
    pat = re.compile(r"#define %s\((\w+), NAME, \.\.\.\)[^\n]*\n(?:[^\n]*\\\n)*[^\n]*\n" % macro)
    m = pat.search(s)
    assert m, macro
    arg = m.group(1)
    body = ("#define %s(%s, NAME, ...) \\\n"
            "    if (%s == at::ScalarType::%s) { \\\n"
            "        using %s = %s; \\\n"
            "        __VA_ARGS__(); \\\n"
            "    } else { \\\n"
            "        AT_ERROR(#NAME, \" not built for type '\", toString(%s), \"' (benchmarks/tools/build_dao.sh DAO_TRIM=1: bf16 x, fp32 weight)\"); \\\n"
            "    }\n") % (macro, arg, arg, scalar, var, typ, arg)
    s = s[:m.start()] + body + s[m.end():]
only("DISPATCH_ITYPE_FLOAT_AND_HALF_AND_BF16", "input_t", "at::BFloat16", "BFloat16")
only("DISPATCH_WTYPE_FLOAT_AND_HALF_AND_BF16", "weight_t", "float", "Float")
p.write_text(s)
print("trimmed to bf16 x / fp32 weight")
PY
fi
echo "building with MAX_JOBS=${DAO_JOBS:-8} (nvcc $(nvcc --version | tail -1))"
MAX_JOBS=${DAO_JOBS:-8} CAUSAL_CONV1D_FORCE_BUILD=TRUE python3 setup.py build_ext --inplace || fail "build_ext"
import_ok || fail "import after build"
touch "$SRC/DONE" "$DAO_DIR/DONE"
echo "built in $(( $(date +%s) - t0 )) s"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  tar -czf "$OUT/dao_prebuilt_sm90.tgz" -C "$DAO_DIR" --exclude build --exclude csrc --exclude tests --exclude DONE --exclude FAILED causal_conv1d-1.7.0 \
    && echo "packed $OUT/dao_prebuilt_sm90.tgz ($(du -h "$OUT/dao_prebuilt_sm90.tgz" | cut -f1)): copy it into .fla/ to skip the build next time"
fi
