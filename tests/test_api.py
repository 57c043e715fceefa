import pytest

import kerascale
from kerascale import errors


def test_public_names_are_pinned():
    assert sorted(kerascale.__all__) == sorted(
        [
            "BatchSearchResult",
            "BatchSizeSearchError",
            "CPUInfo",
            "CheckpointError",
            "ClusterConfigError",
            "ConfigurationError",
            "DataChanges",
            "DataError",
            "Diagnosis",
            "GPUInfo",
            "Hardware",
            "KerascaleError",
            "KerascaleWarning",
            "ModelError",
            "Plan",
            "TPUInfo",
            "UnsupportedError",
            "WorkerLostError",
            "__version__",
            "accumulate",
            "callbacks",
            "clear_cache",
            "connect_cluster",
            "data",
            "detect_hardware",
            "diagnose",
            "find_batch_size",
            "fit",
            "plan",
            "tuner",
        ]
    )
    for name in kerascale.__all__:
        assert hasattr(kerascale, name), name


def test_errors_also_inherit_the_builtin():
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.DataError, ValueError)
    assert issubclass(errors.ClusterConfigError, ValueError)
    assert issubclass(errors.UnsupportedError, NotImplementedError)
    assert issubclass(errors.WorkerLostError, RuntimeError)
    assert issubclass(errors.CheckpointError, RuntimeError)
    for cls in (errors.ConfigurationError, errors.DataError, errors.ModelError):
        assert issubclass(cls, errors.KerascaleError)


def test_callbacks_and_data_are_public():
    assert sorted(kerascale.callbacks.__all__) == [
        "FaultTolerantBackup",
        "GPUMonitor",
        "NoiseScale",
        "PREEMPTED_EXIT_CODE",
        "Prefetch",
        "ProfileWindow",
        "ScaledLearningRate",
        "Throughput",
        "TimeBudget",
    ]
    for name in kerascale.callbacks.__all__:
        assert hasattr(kerascale.callbacks, name), name
    assert kerascale.callbacks.PREEMPTED_EXIT_CODE == 143
    assert sorted(kerascale.data.__all__) == [
        "materialize",
        "materialized",
        "optimize",
        "optimize_report",
    ]
    assert issubclass(kerascale.KerascaleWarning, UserWarning)


def test_prefetch_is_refused_on_tensorflow_with_what_does_it_there():
    with pytest.raises(kerascale.UnsupportedError, match=r"tf\.data's prefetch"):
        kerascale.callbacks.Prefetch()
