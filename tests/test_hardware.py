import json
import sys
import types

import pytest
import tensorflow as tf

import kerascale
from kerascale.sense import hardware
from kerascale.sense.hardware import ClusterInfo, CPUInfo, GPUInfo, Hardware, TPUInfo


@pytest.fixture(autouse=True)
def _this_machine(monkeypatch):
    """This module tests how the machine itself is read (/proc/cpuinfo, the
    cgroup's quota), which the CPU seam replaces when the suite runs as on
    another host (KERASCALE_CPU_SEAM): the seam is off here."""
    monkeypatch.delenv(hardware.CPU_SEAM_VARIABLE, raising=False)


CPUINFO_BF16 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
CPUINFO_PLAIN = "model name\t: Old CPU\nflags\t\t: fpu sse2 avx2 avx512f\n"


def test_parse_cpuinfo_reads_model_and_flags():
    model, flags = hardware.parse_cpuinfo(CPUINFO_BF16)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx512_bf16", "amx_bf16", "avx2"} <= flags


@pytest.mark.parametrize(
    "text, bf16, found",
    [
        (CPUINFO_BF16, True, ("avx512_bf16", "amx_bf16")),
        (CPUINFO_PLAIN, False, ()),
    ],
)
def test_cpu_bf16_from_flags(monkeypatch, text, bf16, found):
    monkeypatch.setattr(hardware, "_read_cpuinfo", lambda: text)
    hw = kerascale.detect_hardware(nvml=False)
    assert hw.cpu.bf16 is bf16
    assert hw.cpu.bf16_flags == found
    assert hw.cpu.cores >= 1


def test_unreadable_cpu_flags_are_noted(monkeypatch):
    monkeypatch.setattr(hardware, "_read_cpuinfo", lambda: "")
    hw = kerascale.detect_hardware(nvml=False)
    assert hw.cpu.bf16 is False
    assert any("CPU flags are not readable" in n for n in hw.notes)


def test_real_detection_on_this_machine(monkeypatch):
    for var in ("TF_CONFIG", "CLUSTER_SPEC", "SLURM_JOB_ID", "TPU_NAME"):
        monkeypatch.delenv(var, raising=False)
    hw = kerascale.detect_hardware()
    assert hw.cpu.cores >= 1
    assert hw.cluster is None
    assert len(hw.gpus) == len(tf.config.list_physical_devices("GPU"))
    # The CPU flags and the Hardware agree, read independently.
    with open("/proc/cpuinfo") as f:
        has_bf16 = any(flag in f.read().split() for flag in hardware.BF16_CPU_FLAGS)
    assert hw.cpu.bf16 is has_bf16
    assert Hardware.from_dict(json.loads(json.dumps(hw.to_dict()))) == hw


def test_detect_hardware_validates_nvml():
    with pytest.raises(kerascale.ConfigurationError, match=r"nvml.*Received: nvml=1"):
        kerascale.detect_hardware(nvml=1)


# --- GPUs through the seam: fake TF devices and a fake pynvml -------------------


class _FakeNVMLError(Exception):
    pass


def fake_nvml(devices, init_error=None):
    """A stand-in for nvidia-ml-py with the calls kerascale.sense makes. A
    device: {name, uuid, mem (total), cc}, and optionally free (bytes) and
    processes ([(pid, bytes)])."""
    m = types.ModuleType("pynvml")

    def init():
        if init_error:
            raise _FakeNVMLError(init_error)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    m.nvmlDeviceGetName = lambda h: h["name"].encode()
    m.nvmlDeviceGetUUID = lambda h: h["uuid"]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=h["mem"], free=h.get("free", h["mem"])
    )
    m.nvmlDeviceGetCudaComputeCapability = lambda h: h["cc"]
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used)
        for pid, used in h.get("processes", ())
    ]
    return m


@pytest.fixture
def fake_gpus(monkeypatch):
    """Makes TensorFlow report the given GPUs (name, cc)."""

    def install(specs):
        real_list = tf.config.list_physical_devices
        devices = [
            tf.config.PhysicalDevice(
                name=f"/physical_device:GPU:{i}", device_type="GPU"
            )
            for i in range(len(specs))
        ]
        details = {d.name: s for d, s in zip(devices, specs, strict=True)}

        def list_physical(kind=None):
            return devices if kind == "GPU" else real_list(kind)

        def get_details(device):
            name, cc = details[device.name]
            return {"device_name": name, "compute_capability": cc}

        monkeypatch.setattr(tf.config, "list_physical_devices", list_physical)
        monkeypatch.setattr(tf.config.experimental, "get_device_details", get_details)

    return install


NVML_DEVICES = [
    {"name": "NVIDIA A100", "uuid": "GPU-aaa", "mem": 40 << 30, "cc": (8, 0)},
    {"name": "Tesla V100", "uuid": "GPU-bbb", "mem": 16 << 30, "cc": (7, 0)},
]


def test_gpus_enriched_with_nvml_memory(monkeypatch, fake_gpus):
    fake_gpus([("NVIDIA A100", (8, 0)), ("Tesla V100", (7, 0))])
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(NVML_DEVICES))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hw = kerascale.detect_hardware()
    assert [g.memory_total for g in hw.gpus] == [40 << 30, 16 << 30]
    assert [g.compute_capability for g in hw.gpus] == [(8, 0), (7, 0)]
    assert hw.gpus_homogeneous is False
    assert hw.min_compute_capability == (7, 0)
    assert "1x NVIDIA A100 (40.0 GiB, cc 8.0)" in hw.summary()


def test_cuda_visible_devices_maps_tf_order_to_nvml(monkeypatch, fake_gpus):
    # TF's GPU:0 is the physical GPU 1 when CUDA_VISIBLE_DEVICES=1.
    fake_gpus([("Tesla V100", (7, 0))])
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(NVML_DEVICES))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert kerascale.detect_hardware().gpus[0].memory_total == 16 << 30
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa")
    fake_gpus([("NVIDIA A100", (8, 0))])
    assert kerascale.detect_hardware().gpus[0].memory_total == 40 << 30


def test_missing_driver_does_not_crash(monkeypatch, fake_gpus):
    fake_gpus([("NVIDIA A100", (8, 0))])
    monkeypatch.setitem(
        sys.modules, "pynvml", fake_nvml([], init_error="Driver Not Loaded")
    )
    hw = kerascale.detect_hardware()
    assert hw.gpus[0].memory_total is None
    assert hw.gpus[0].compute_capability == (8, 0)
    assert any("Driver Not Loaded" in n for n in hw.notes)


def test_nvml_not_installed_is_noted(monkeypatch, fake_gpus):
    fake_gpus([("NVIDIA A100", (8, 0))])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    hw = kerascale.detect_hardware()
    assert len(hw.gpus) == 1
    assert any("nvidia-ml-py" in n for n in hw.notes)


def test_gpus_nvml_sees_but_tf_cannot_use(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(NVML_DEVICES))
    hw = kerascale.detect_hardware()
    assert hw.gpus == ()
    assert any("TensorFlow cannot use them" in n for n in hw.notes)


# --- TPU -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, name",
    [
        ({"TPU_NAME": "my-tpu"}, "my-tpu"),
        ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, "grpc://10.0.0.2:8470"),
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, "local"),
    ],
)
def test_tpu_from_environment(env, name):
    tpu = hardware._detect_tpu(env)
    assert tpu == TPUInfo(name=name, source=next(iter(env)))


def test_no_tpu_without_environment(monkeypatch):
    monkeypatch.setattr(hardware.glob, "glob", lambda pattern: [])
    assert hardware._detect_tpu({}) is None


# --- Clusters --------------------------------------------------------------------


def test_tf_config_two_workers():
    tf_config = {
        "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
        "task": {"type": "worker", "index": 1},
    }
    c = hardware.detect_cluster({"TF_CONFIG": json.dumps(tf_config)})
    assert c == ClusterInfo("TF_CONFIG", 2, "worker", 1)
    assert c.is_multi_worker


def test_tf_config_chief_plus_workers_counts_chief():
    tf_config = {
        "cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"], "ps": ["d:1"]},
        "task": {"type": "chief", "index": 0},
    }
    c = hardware.detect_cluster({"TF_CONFIG": json.dumps(tf_config)})
    assert c.num_workers == 3 and c.task_type == "chief"


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"cluster": [1]}', 'TF_CONFIG["cluster"] must be a non-empty object'),
    ],
)
def test_malformed_tf_config_is_reported_not_raised(text, message):
    c = hardware.detect_cluster({"TF_CONFIG": text})
    assert c.error and message in c.error
    assert not c.is_multi_worker


def test_vertex_cluster_spec():
    spec = {
        "cluster": {
            "workerpool0": ["chief:2222"],
            "workerpool1": ["w1:2222", "w2:2222"],
            "workerpool2": ["ps:2222"],
        },
        "task": {"type": "workerpool1", "index": 0},
    }
    c = hardware.detect_cluster({"CLUSTER_SPEC": json.dumps(spec)})
    assert c == ClusterInfo("CLUSTER_SPEC", 3, "workerpool1", 0)


def test_slurm():
    env = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}
    assert hardware.detect_cluster(env) == ClusterInfo("SLURM", 4, "worker", 2)
    single = hardware.detect_cluster({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "1"})
    assert not single.is_multi_worker
    bad = hardware.detect_cluster({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "x"})
    assert "not a number" in bad.error


def test_tf_config_wins_over_slurm():
    env = {
        "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}}),
        "SLURM_JOB_ID": "1",
        "SLURM_NTASKS": "8",
    }
    assert hardware.detect_cluster(env).source == "TF_CONFIG"


def test_hardware_round_trips_through_dict():
    hw = Hardware(
        cpu=CPUInfo(cores=4, bf16=True, bf16_flags=("amx_bf16",)),
        gpus=(GPUInfo(0, "A100", 1 << 30, (8, 0)),),
        tpu=TPUInfo("local", "/dev/accel0"),
        cluster=ClusterInfo("SLURM", 2, "worker", 0),
        notes=("x",),
    )
    assert Hardware.from_dict(json.loads(json.dumps(hw.to_dict()))) == hw


@pytest.mark.parametrize(
    "text, cores",
    [
        ("200000 100000", 2),
        ("150000 100000", 2),
        ("max 100000", None),
        ("", None),
        ("50000 100000", 1),
        ("junk", None),
    ],
)
def test_cgroup_cpu_quota(text, cores):
    assert hardware._cgroup_cpu_quota(text) == cores


def test_cores_capped_by_cgroup_quota(monkeypatch):
    real = hardware._read_text
    monkeypatch.setattr(
        hardware,
        "_read_text",
        lambda path: "100000 100000" if path.endswith("cpu.max") else real(path),
    )
    assert kerascale.detect_hardware(nvml=False).cpu.cores == 1


def test_the_cpu_seam_replaces_what_this_machine_says(monkeypatch):
    """KERASCALE_CPU_SEAM runs the suite as on another host (CONTRIBUTING.md):
    each key it gives replaces this machine's, and a malformed one is an
    error that names the variable, the value and the fix."""
    import json

    from kerascale.errors import ConfigurationError
    from kerascale.sense import hardware

    model = "Intel(R) Xeon(R) Platinum 8488C Processor with a name that runs long"
    seam = {"model": model, "cores": 4, "bf16": False}
    monkeypatch.setenv(hardware.CPU_SEAM_VARIABLE, json.dumps(seam))
    cpu = hardware.detect_hardware(nvml=False).cpu
    assert (cpu.model, cpu.cores, cpu.bf16, cpu.bf16_flags) == (model, 4, False, ())
    monkeypatch.setenv(hardware.CPU_SEAM_VARIABLE, '{"bf16": true}')
    cpu = hardware.detect_hardware(nvml=False).cpu
    assert cpu.bf16 and cpu.bf16_flags
    for bad in ('{"cores": 0}', '{"threads": 2}', "[1]", "four"):
        monkeypatch.setenv(hardware.CPU_SEAM_VARIABLE, bad)
        with pytest.raises(ConfigurationError, match="KERASCALE_CPU_SEAM") as e:
            hardware.detect_hardware(nvml=False)
        assert repr(bad) in str(e.value)
