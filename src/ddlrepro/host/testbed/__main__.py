"""The testbed's command line (scripts/testbed calls it):

    start  --owner X --hosts N [--link-rate 1gbit] [--subnet 198.18.0.0/24]   build it; it stays until `stop`
    stop   --owner X                                                          tear it down (or what a crash left)
    status [--owner X]                                                        hosts, addresses, rates, counters
    rate   --owner X [--host H] RATE                                          change a rate (every host without --host)
    exec   --owner X HOST COMMAND...                                          run a command on a host

`start` leaves a small keeper process holding the testbed (its pid is the state file's owner pid): `stop` sends it
SIGTERM and it tears the testbed down; a keeper killed outright leaves a testbed the next start or stop removes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from ddlrepro.host.testbed import limits
from ddlrepro.host.testbed.limits import TestbedError
from ddlrepro.host.testbed.network import (
    STATE_DIR,
    Testbed,
    owner_alive,
    read_state,
    remove_leftovers,
    stop_owner,
)

READY = "testbed ready"
STOP_SECONDS = 10.0


def hold(args: argparse.Namespace) -> None:
    """The keeper: build the testbed, say so on stdout, then wait for SIGTERM or SIGINT and tear it down."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with Testbed.create(args.owner, args.hosts, args.link_rate, args.subnet):
        print(READY, flush=True)
        quiet = os.open(os.devnull, os.O_WRONLY)  # the starting command stops reading here and exits
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        while True:
            signal.pause()


def start(args: argparse.Namespace) -> None:
    state = read_state(args.owner)
    if state and owner_alive(state):
        raise TestbedError(
            f"testbed {args.owner!r} is already running (pid {state['pid']}): stop it first "
            f"(scripts/testbed stop --owner {args.owner}) or choose another owner name"
        )
    keeper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddlrepro.host.testbed",
            "hold",
            "--owner",
            args.owner,
            "--hosts",
            str(args.hosts),
            "--subnet",
            args.subnet,
            *(["--link-rate", args.link_rate] if args.link_rate else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    said = keeper.stdout.readline().strip() if keeper.stdout else ""
    if said != READY:
        keeper.wait()
        error = keeper.stderr.read().strip().splitlines() if keeper.stderr else []
        raise TestbedError(error[-1].split(": ", 1)[-1] if error else f"the keeper exited with {keeper.returncode}")
    status(args)


def stop(args: argparse.Namespace) -> None:
    state = read_state(args.owner)
    stop_owner(args.owner, STOP_SECONDS)
    removed = remove_leftovers(args.owner)
    print(f"testbed {args.owner!r} stopped" if state or removed else f"no testbed {args.owner!r}")


def status(args: argparse.Namespace) -> None:
    owners = [args.owner] if args.owner else sorted(path.stem for path in STATE_DIR.glob("*.json"))
    if not owners:
        print("no testbed")
    for owner in owners:
        try:
            testbed = Testbed.attach(owner)
        except TestbedError as error:
            print(error)
            continue
        counters = testbed.counters()
        print(f"testbed {owner}: {len(testbed.hosts)} hosts on {testbed.subnet}, keeper pid {testbed.pid}")
        for host in testbed.hosts:
            rate = limits.format_rate(testbed.rates[host.name])
            count = counters[host.name]
            print(
                f"  {host.name:<16} {host.address:<15} {host.namespace:<20} {rate:>10}"
                f"  rx {count['rx_bytes']} B  tx {count['tx_bytes']} B"
            )


def rate(args: argparse.Namespace) -> None:
    testbed = Testbed.attach(args.owner)
    testbed.set_rate(args.host, args.rate)
    print(json.dumps({name: limits.format_rate(bits) for name, bits in testbed.rates.items()}))


def run_on_host(args: argparse.Namespace) -> None:
    testbed = Testbed.attach(args.owner)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    os.execvp("ip", [*testbed.exec_prefix(args.host), *command])


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="scripts/testbed", description=__doc__.split("\n\n")[0])
    actions = main.add_subparsers(dest="action", required=True)
    for name in ("start", "hold"):
        action = actions.add_parser(name)
        action.add_argument("--owner", required=True)
        action.add_argument("--hosts", type=int, required=True)
        action.add_argument("--link-rate")
        action.add_argument("--subnet", default="198.18.0.0/24")
    actions.add_parser("stop").add_argument("--owner", required=True)
    actions.add_parser("status").add_argument("--owner")
    change = actions.add_parser("rate")
    change.add_argument("--owner", required=True)
    change.add_argument("--host")
    change.add_argument("rate")
    execute = actions.add_parser("exec")
    execute.add_argument("--owner", required=True)
    execute.add_argument("host")
    execute.add_argument("command", nargs=argparse.REMAINDER)
    return main


ACTIONS = {"start": start, "hold": hold, "stop": stop, "status": status, "rate": rate, "exec": run_on_host}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return limits.exit_code("testbed", lambda: ACTIONS[args.action](args))


if __name__ == "__main__":
    sys.exit(main())
