import numpy as np

from tests.lab import b64, call


def test_lab_round_trips_arrays(lab_session):
    x = np.arange(10, dtype=np.float32) / 3
    out = call(lab_session, "return {y: args.x, n: args.x.length};", {"x": b64(x)})
    np.testing.assert_array_equal(out["y"], x)
    assert out["n"] == 10
