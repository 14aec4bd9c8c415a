"""Old name of windows.py, kept while tests/test_data_batches.py and bench/bench_data.py import
it from here; delete once they import andrea.data.windows."""

from andrea.data.windows import sample_batch, train_windows, val_windows  # noqa: F401
