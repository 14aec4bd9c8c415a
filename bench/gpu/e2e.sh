#!/usr/bin/env bash
# The end-to-end tests that matter on a GPU, in the real browser on the GPU (run ON the GPU
# machine, from the checkout's root, after bench/gpu/unpack_app.sh and `. /tmp/andrea-gpu/env.sh`):
# training from the UI, a killed browser's run resumed bit for bit on this adapter, the export
# loaded in transformers and matched against the engine, a crashed GPU process resumed by the
# page and by `andrea train`, and the mixed-precision kernels against torch (they skip where the
# adapter has no f16 subgroup matrices) with the loss scaling. Extra arguments go to pytest.
set -euo pipefail
export ANDREA_GPU_BROWSER=1
exec python3 -m pytest -p no:cacheprovider -q \
  "e2e/test_training.py::test_train_from_the_ui" \
  "e2e/test_resume.py::test_resume_in_a_new_browser_is_bit_exact" \
  "e2e/test_export.py::test_trained_run_exports_to_hf_and_matches_the_engine" \
  e2e/test_device_lost.py tests/unit/gpu/test_mixed_kernels.py tests/unit/gpu/test_mixed_step.py \
  tests/unit/gpu/test_loss_scale.py "$@"
