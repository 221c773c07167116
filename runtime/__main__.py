"""python -m runtime <command>: what deploy artifacts run inside the image on every node."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

from runtime import addresses, numbers
from runtime.contract import (DEFAULT_PORT_BASE, EXIT_HEAD_LOST, EXIT_NODE_CANNOT_START, EXIT_NODE_LOST,
                              MAX_CPUS_PER_NODE, MAX_GPUS_PER_NODE)


def parser() -> argparse.ArgumentParser:
    """The commands and their options."""
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("selfcheck", help="Import ray and torch, load the baked cluster spec, print a JSON report.")
    sc.add_argument("--require-cuda", action="store_true", help="Fail unless torch is a CUDA build.")
    la = sub.add_parser("launch", help="Form the Ray cluster from the scheduler's variables; run CMD on the head.",
                        description="Run on every node: python -m runtime launch [options] -- python train.py ...",
                        epilog="Exit codes: the driver's on the head (a driver killed by signal N: 128+N); on a "
                               f"worker, the driver's code the head published; {EXIT_NODE_CANNOT_START}: this node "
                               f"could not start or join (the message says why); {EXIT_HEAD_LOST}: a worker lost the "
                               "head before the driver's code was published (the job's code is the head's); "
                               f"{EXIT_NODE_LOST}: a worker's own Ray died after it joined.")
    la.add_argument("--port-base", type=numbers.arg_whole(1024, 65535), default=DEFAULT_PORT_BASE, help=f"GCS port; all of Ray's ports follow it (default {DEFAULT_PORT_BASE}).")
    la.add_argument("--port-stride", type=numbers.arg_whole(0, 1000), default=0,
                    help="Offset node k's own ports by k*STRIDE, for several nodes on one host (default 0).")
    la.add_argument("--barrier-timeout", type=numbers.arg_finite(0, 7 * 86400, low_open=True), default=300, help="Seconds the head waits for all nodes.")
    la.add_argument("--join-timeout", type=numbers.arg_finite(0, 7 * 86400, low_open=True), default=300, help="Seconds a worker waits for the head.")
    la.add_argument("--no-auth", action="store_true", help="Run Ray without token authentication (trusted networks only).")
    la.add_argument("--num-cpus", type=numbers.arg_whole(1, MAX_CPUS_PER_NODE), default=None,
                    help="CPUs this node offers Ray (default: detected).")
    la.add_argument("--num-gpus", type=numbers.arg_whole(0, MAX_GPUS_PER_NODE), default=None,
                    help="GPUs this node offers Ray (default: from the scheduler).")
    la.add_argument("--node-ip", type=addresses.arg_host, default=None, help="Address other nodes reach this one at (default: detected).")
    la.add_argument("--warm-hosts", type=numbers.arg_whole(0, 1024), default=None,
                    help="Worker hosts started per node while the barrier waits, for the driver's first worker "
                         "group (default: the node's GPUs, or 1; 0: none).")
    la.add_argument("--no-preload", dest="preload", action="store_false",
                    help="Start the driver after the barrier, imports and all. By default a `python script.py` or "
                         "`python -m module` driver starts while the barrier waits, imports ray and torch, and runs "
                         "the script once every node is up (runtime/cluster/preload.py).")
    la.add_argument("--no-zygote", dest="zygote", action="store_false",
                    help="Start each Ray worker as a fresh interpreter that imports torch itself. By default "
                         "every node imports torch once, while it waits, in a zygote that the raylet's Python "
                         "workers are forked from (runtime/cluster/zygote.py).")
    la.add_argument("--serve", action="store_true",
                    help="A held cluster's node (invoke up / invoke down): the head forms the cluster and holds it "
                         "without a driver until SIGTERM; drivers come with `python -m runtime run` "
                         "(runtime/cluster/serving.py). No process of the node has the image's project directory on "
                         "PYTHONPATH: a run's code is only what it sent. Give no command.")
    la.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the driver command, run on the head only.")
    ru = sub.add_parser("run", help="Run a driver on the cluster this head holds (launch --serve), in the code "
                                    "directory given; Ray ships that directory to every node as the job's working_dir.",
                        description="On the head of a held cluster: python -m runtime run --code-dir DIR -- python "
                                    "train.py ...",
                        epilog="Exit code: the driver's (a driver killed by signal N: 128+N); 2: bad input; 1: no "
                               "cluster is serving here.")
    ru.add_argument("--code-dir", required=True, help="The project's code, unpacked (the driver's cwd and the "
                                                      "job's working_dir on every node).")
    ru.add_argument("--unpack-stdin", metavar="ROOT",
                    help="The code comes as a tar on stdin, its members under --code-dir's path below ROOT "
                         "(invoke run into a container: Pyxis, Kubernetes); unpacked unless --code-dir exists "
                         "(it is named by the code's hash). The driver's stdin is then /dev/null.")
    ru.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the driver command.")
    sub.add_parser("torchrun", help="Run a script written for torchrun on every node of the cluster: NPROC ranks a node, "
                                    "torchrun's environment, its restarts (the job's driver, on the head).",
                   add_help=False)
    sub.add_parser("stop", help="Stop the held cluster this head serves (invoke down): the head stops serving and "
                                "publishes exit code 0, every node leaves in order.",
                   description="On the head of a held cluster: python -m runtime stop",
                   epilog="Exit code: 0 once the head accepted; 1: no cluster is serving here.")
    return parser


def _reported(command: str, work: Callable[[], int], errors: tuple = (), code: Optional[int] = None) -> int:
    """WORK's exit code; a RaytrainError (or one of ERRORS) becomes one line `COMMAND: error: ...` on stderr
    and exit code CODE (default: the error's own)."""
    from runtime.errors import RaytrainError
    try:
        return work()
    except (RaytrainError, *errors) as e:
        print(f"{command}: error: {e}", file=sys.stderr, flush=True)
        return code if code is not None else getattr(e, "exit_code", 1)


def _driver_cmd(cmd: list[str]) -> list[str]:
    return cmd[1:] if cmd[:1] == ["--"] else cmd


def _launch(args: argparse.Namespace) -> int:
    from runtime.cluster.launch import LaunchOptions, launch
    opts = LaunchOptions(port_base=args.port_base, port_stride=args.port_stride, barrier_timeout_s=args.barrier_timeout,
                         join_timeout_s=args.join_timeout, auth="disabled" if args.no_auth else "token",
                         num_cpus=args.num_cpus, num_gpus=args.num_gpus, node_ip=args.node_ip,
                         warm_hosts=args.warm_hosts, preload_driver=args.preload, zygote=args.zygote,
                         serve=args.serve)
    return launch(_driver_cmd(args.cmd), opts)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path
    from runtime.cluster import serving
    return serving.run(Path(args.code_dir), _driver_cmd(args.cmd),
                       unpack_root=Path(args.unpack_stdin) if args.unpack_stdin else None)


def _stop(args: argparse.Namespace) -> int:
    from runtime.cluster import serving
    return serving.request_stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["torchrun"]:  # its own parser (runtime/workers/script_ranks.py): the script's args pass through
        from runtime.workers import script_ranks
        return script_ranks.main(argv[1:])
    args = parser().parse_args(argv)
    if args.command == "selfcheck":  # imported here: it loads the spec's models, which `run` (a held run) does not need
        from runtime.cluster import selfcheck
        return selfcheck.run(require_cuda=args.require_cuda)
    if args.command == "stop":
        return _reported("stop", lambda: _stop(args))
    if args.command == "run":
        return _reported("run", lambda: _run(args))
    return _reported("launch", lambda: _launch(args), errors=(ValueError,), code=2)


if __name__ == "__main__":
    sys.exit(main())
