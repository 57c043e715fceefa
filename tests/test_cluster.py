"""Strict TF_CONFIG and CLUSTER_SPEC checks: each malformed case is an error
that names the field, raised before any server starts."""

import json

import pytest

import kerascale
from kerascale.errors import ClusterConfigError
from kerascale.sense import hardware
from kerascale.sense.cluster import cluster_spec_to_tf_config, validate_tf_config

GOOD = {
    "cluster": {
        "chief": ["10.0.0.1:2222"],
        "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
    },
    "task": {"type": "worker", "index": 1},
}


def with_(**changes):
    config = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        node = config
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return json.dumps(config)


@pytest.mark.parametrize(
    "text, field",
    [
        ("{not json", "TF_CONFIG is not valid JSON"),
        ("[1]", "TF_CONFIG must be a JSON object"),
        (with_(task=KeyError), 'TF_CONFIG["task"]'),
        (with_(task__index=2), 'TF_CONFIG["task"]["index"]'),
        (with_(task__index=-1), 'TF_CONFIG["task"]["index"]'),
        (with_(task__index="1"), 'TF_CONFIG["task"]["index"]'),
        (with_(task__type="gpu_worker"), 'TF_CONFIG["task"]["type"]'),
        (
            with_(cluster__gpu_worker=["10.0.0.9:1"]),
            'TF_CONFIG["cluster"]["gpu_worker"]',
        ),
        (with_(cluster__worker=["10.0.0.2:http", "10.0.0.3:2222"]), '["worker"][0]'),
        (with_(cluster__worker=["10.0.0.2:70000", "10.0.0.3:2222"]), '["worker"][0]'),
        (with_(cluster__worker=["10.0.0.2", "10.0.0.3:2222"]), '["worker"][0]'),
        (
            with_(cluster__worker=["10.0.0.1:2222", "10.0.0.3:2222"]),
            "repeats the address",
        ),
        (with_(cluster__worker=[]), 'TF_CONFIG["cluster"]["worker"]'),
        (with_(cluster={}), 'TF_CONFIG["cluster"]'),
    ],
)
def test_malformed_tf_config_names_the_field(text, field):
    with pytest.raises(ClusterConfigError) as info:
        validate_tf_config(text)
    assert field in str(info.value)
    # Detection reports it; planning raises it before any server starts.
    cluster = hardware.detect_cluster({"TF_CONFIG": text})
    assert field in cluster.error


def test_a_good_tf_config_passes():
    config = validate_tf_config(json.dumps(GOOD))
    assert config["task"] == {"type": "worker", "index": 1}
    info = hardware.detect_cluster({"TF_CONFIG": json.dumps(GOOD)})
    assert (info.num_workers, info.task_type, info.task_index) == (3, "worker", 1)


def test_planning_stops_on_a_malformed_cluster(monkeypatch):
    import keras
    import numpy as np

    monkeypatch.setenv("TF_CONFIG", with_(task__index=5))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.zeros((8, 2), "float32")
    with pytest.raises(ClusterConfigError, match=r'TF_CONFIG\["task"\]\["index"\]'):
        kerascale.plan(model, x, x[:, :1], verbose=0)


def test_vertex_cluster_spec_becomes_a_tf_config():
    spec = {
        "cluster": {
            "workerpool0": ["chief:2222"],
            "workerpool1": ["w1:2222", "w2:2222"],
            "workerpool2": ["ps:2222"],
        },
        "task": {"type": "workerpool1", "index": 1, "trial": ""},
    }
    config = cluster_spec_to_tf_config(json.dumps(spec))
    assert config["cluster"] == {
        "chief": ["chief:2222"],
        "worker": ["w1:2222", "w2:2222"],
        "ps": ["ps:2222"],
    }
    assert config["task"] == {"type": "worker", "index": 1}
    spec["task"]["index"] = 2
    with pytest.raises(ClusterConfigError, match=r'\["task"\]\["index"\]'):
        cluster_spec_to_tf_config(json.dumps(spec))
    spec["cluster"]["workerpool7"] = ["x:1"]
    with pytest.raises(ClusterConfigError, match="workerpool7"):
        cluster_spec_to_tf_config(json.dumps(spec))
