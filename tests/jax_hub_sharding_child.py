"""A keras-hub backbone sharded on the JAX backend, in a child process of
tests/test_jax_with_tensorflow.py (the TensorFlow environment has keras-hub
and jax; 2 CPU devices). Prints JSON: the plan's sharding, and the hub's own
layout for the same mesh."""

import json
import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=2"
    " --xla_cpu_collective_call_terminate_timeout_seconds=300"
)  # tests_common/xla_flags.py
os.environ["KERASCALE_CPU_DEVICES_STAND_IN"] = "1"  # planned as 2 GPUs

import keras
import keras_hub
import numpy as np

import kerascale

keras.utils.set_random_seed(0)
backbone = keras_hub.models.GemmaBackbone(
    vocabulary_size=4096,
    num_layers=1,
    num_query_heads=2,
    num_key_value_heads=2,
    hidden_dim=256,
    intermediate_dim=1024,
    head_dim=128,
)
backbone.compile("adam", "mse")
tokens = np.random.default_rng(0).integers(0, 4096, (32, 16)).astype("int32")
x = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
y = np.zeros((32, 16, 256), "float32")
plan = kerascale.plan(backbone, x, y, batch_size=8, device_memory="24MiB", verbose=0)
mesh = keras.distribution.DeviceMesh(
    tuple(plan.sharding["mesh"]), ("batch", "model"), keras.distribution.list_devices()
)
theirs = keras_hub.models.GemmaBackbone.get_layout_map(mesh)
expected = {
    v.path: list(theirs[v.path].axes) for v in backbone.weights if theirs[v.path]
}
history = kerascale.fit(
    backbone, x, y, batch_size=8, epochs=1, verbose=0, device_memory="24MiB"
)
print(
    json.dumps(
        {
            "strategy": plan.strategy,
            "sharding": plan.sharding,
            "expected": expected,
            "reason": plan.reasons.get("sharding", ""),
            "loss": history.history["loss"],
        }
    )
)
