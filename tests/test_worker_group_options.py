"""A worker group's options (runtime.workers.worker_group.GroupOptions): checked once, before Ray or the
cluster sees any; every bad one is an InputError (still a ValueError) that starts with its name. No Ray
cluster: the group is given none, as scripts/probe_inputs.py does."""
from types import SimpleNamespace

import pydantic
import pytest

from runtime.errors import InputError
from runtime.workers.worker_group import GroupOptions, RayWorkerGroup


@pytest.mark.parametrize("option,value,says", [
    ("load_balancing_strategy", "fastest", "not one of round_robin, least_loaded"),
    ("enable_gradient_compression", "zip", "not True or one of fp16, bf16, powersgd"),
    ("backend", "mpi", "not one of auto, nccl, gloo or None"),
    ("memory_limit", "lots", "not a size such as 8GB"),
    ("env", {"OMP_NUM_THREADS": 1}, "OMP_NUM_THREADS=1 is not text without NUL; give every variable's value as a str"),
    ("env", {"A=B": "1"}, "'A=B' is not a variable name"),
    ("env", {"": "1"}, "'' is not a variable name"),
    ("env", {"A": "x\x00y"}, "A='x\\x00y' is not text without NUL"),
    ("memory_limit", "8GB\n", "not a size such as 8GB"),
    ("enable_gradient_compression", [], "not True or one of fp16, bf16, powersgd"),
    ("enable_gradient_compression", 0, "not True or one of fp16, bf16, powersgd"),
    ("env", ["A=1"], "not a dict of names"),
    ("init_kwargs", {1: "x"}, "not a dict of names"),
    ("init_args", "path", "not a tuple; give the worker class's positional arguments as a tuple"),
    ("restart_on_failure", "maybe", "not a boolean"),
    ("async_communication", 2, "not a boolean"),
])
def test_every_option_is_refused_by_name_as_an_input_error(option, value, says):
    with pytest.raises(InputError, match=f"^{option}: ") as e:
        RayWorkerGroup(None, object, **{option: value})  # checked before the cluster is touched
    assert says in str(e.value) and isinstance(e.value, ValueError)


def test_compression_without_a_process_group_names_the_option():
    with pytest.raises(InputError, match=r"^enable_gradient_compression: .*needs a torch process group"):
        RayWorkerGroup(None, object, backend=None, enable_gradient_compression=True)


def test_several_bad_options_are_told_at_once_one_line_each():
    with pytest.raises(InputError) as e:
        RayWorkerGroup(None, object, max_restarts=-1, call_timeout_s="soon", colocated_share=0)
    lines = str(e.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["max_restarts", "call_timeout_s", "colocated_share"], lines


def test_options_are_parsed_once_into_a_frozen_model_with_resolved_values():
    opts = GroupOptions.parse(init_args=[1], enable_gradient_compression=True, enable_load_balancing=True,
                              memory_limit="1GiB", max_restarts="3", call_timeout_s="2.5", env=None)
    assert opts.init_args == (1,) and opts.compression == "fp16" and opts.strategy == "least_loaded"
    assert opts.memory_limit == 2**30 and opts.max_restarts == 3 and opts.call_timeout_s == 2.5 and opts.env == {}
    assert GroupOptions.parse().strategy == "round_robin" and GroupOptions.parse().compression is None
    with pytest.raises(pydantic.ValidationError):
        opts.max_restarts = 5  # frozen
    with pytest.raises(InputError, match="^bogus: not an option of RayWorkerGroup"):
        GroupOptions.parse(bogus=1)


def test_a_memory_limit_over_the_clusters_reservation_is_an_input_error():
    reserving = SimpleNamespace(memory_per_bundle=2**30, max_colocated_worker_groups=2)
    with pytest.raises(InputError, match=r"memory_limit 1.00 GiB cannot be met: the cluster reserves 0.50 GiB"):
        GroupOptions.parse(memory_limit="1GiB").reserved_memory(reserving)
    with pytest.raises(InputError, match="^spare_workers: with a reserved memory_limit"):
        GroupOptions.parse(memory_limit="512MiB", spare_workers=True).reserved_memory(reserving)
    assert GroupOptions.parse(memory_limit="512MiB").reserved_memory(reserving) == 2**29
    plain = SimpleNamespace(memory_per_bundle=None, max_colocated_worker_groups=1)
    assert GroupOptions.parse(memory_limit="8GB").reserved_memory(plain) is None  # enforced per worker only


def test_the_nemo_rl_face_checks_its_values_by_name():
    """Round 4's cases of the NeMo RL face: ports outside 1-65535, a use_gpus that is not a boolean, an excluded
    port set given as text, a workers_per_node that is not a count of 1 or more; each one line naming it."""
    import socket
    from runtime.nemo_rl.virtual_cluster import RayVirtualCluster
    from runtime.nemo_rl.worker_groups import RayWorkerGroup as NemoGroup
    from runtime.workers import free_ports
    for low, high, says in ((-5, 10, "port_range_low: -5 is not a whole number between 1 and 65535"),
                            (60000, 70000, "port_range_high: 70000 is not a whole number between 1 and 65536"),
                            (9000, 9000, "port range [9000, 9000) is empty")):
        with pytest.raises(ValueError, match=__import__("re").escape(says)):
            RayVirtualCluster([1], use_gpus=False, port_range_low=low, port_range_high=high)
    with pytest.raises(InputError, match="use_gpus: 'maybe' is not a boolean"):
        RayVirtualCluster([1], use_gpus="maybe")
    assert RayVirtualCluster([1], use_gpus="no").use_gpus is False
    with socket.socket() as sock, pytest.raises(InputError, match="excluded: '45001' is not a collection of ports"):
        free_ports.bind_in_range(sock, 45000, 45010, excluded="45001")
    stand_in = SimpleNamespace(cluster=SimpleNamespace(get_placement_groups=lambda: [SimpleNamespace(bundle_count=2)]))
    for count, says in ((-1, "workers_per_node: -1 is not a whole number >= 1"), (0, "is not a whole number >= 1"),
                        (True, "workers_per_node: 'True' is not a whole number"),
                        ([3], "Placement group 0 has 2 bundles, but 3 workers were requested")):
        with pytest.raises(ValueError, match=__import__("re").escape(says)):
            NemoGroup._one_per_bundle(stand_in, count)
    assert NemoGroup._one_per_bundle(stand_in, 2) == [(0, [0]), (0, [1])]
