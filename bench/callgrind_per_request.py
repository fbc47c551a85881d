#!/usr/bin/env python3
"""Instructions per proxied request of a server, counted by valgrind's callgrind.

Starts COMMAND under callgrind, waits until it accepts connections on --addr, sends --warmup
requests with the load client (bench/examples/proxy_load.rs: one keep-alive connection, one
request after the other), zeroes callgrind's counters (`callgrind_control --zero`), sends
--requests more, dumps the counters (`callgrind_control --dump`) and stops the server. The
instructions of the dump divided by --requests are what one request costs the server, every
thread of it included: start-up, the first connection and the warm-up are not in the count.

    bench/callgrind_per_request.py --load target/release/examples/proxy_load \\
        --addr 127.0.0.1:8080 --mode unique --requests 2000 -- idem serve ...

Prints `<instructions per request>`; with --top N, then the N functions of the dump that
executed the most instructions themselves (callgrind_annotate), as `instructions  share  name`.
"""

import argparse
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def wait_listening(addr, process, limit=120.0):
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server exited with {process.returncode} before it listened on {addr}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"nothing listens on {addr} after {limit:.0f} s")


def control(option, pid):
    done = subprocess.run(["callgrind_control", option, str(pid)], capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0 or "OK" not in done.stdout:
        sys.exit(f"callgrind_control {option} {pid} failed: {done.stdout}{done.stderr}")


def load(args, count, run):
    subprocess.run([args.load, args.addr, str(count), args.mode, run, args.path], check=True)


def totals(path):
    with open(path, encoding="utf-8", errors="replace") as dump:
        for line in dump:
            if line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals line in {path}")


def top(path, count, total, requests):
    if count <= 0:
        return []
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                               capture_output=True, text=True, check=True).stdout
    rows = []
    started = False
    for line in annotated.splitlines():
        # The function table follows the line of dashes after the "Ir  file:function" header.
        if "file:function" in line:
            started = True
            continue
        if not started or not line.strip() or line.startswith("-"):
            continue
        figure, _, name = line.strip().partition(" ")
        try:
            instructions = int(figure.replace(",", ""))
        except ValueError:
            continue
        name = name.strip()
        if name.startswith("("):  # callgrind_annotate 3.21+: "(12.3%)  file:function"
            name = name.partition(")")[2].strip()
        if instructions * 100 >= total * 99:
            continue  # a frame every request runs under (a thread's start, block_on)
        name = name.split(" [")[0]  # the object file
        place, colon, function = name.partition(":")
        if colon and (place == "???" or "/" in place or "." in place):
            name = function  # "file:function" or "???:function"
        rows.append((instructions // requests, name))
        if len(rows) == count:
            break
    return [(i, i * requests / total if total else 0.0, name) for i, name in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", required=True, help="the proxy_load binary")
    parser.add_argument("--addr", required=True, help="where COMMAND listens, HOST:PORT")
    parser.add_argument("--mode", choices=["unique", "replay"], default="unique",
                        help="a new Idempotency-Key per request, or one key for all")
    parser.add_argument("--path", default="/echo", help="the path the requests are posted to")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--top", type=int, default=0, help="also print the N costliest functions")
    parser.add_argument("--keep", help="copy the dump to this file (for callgrind_annotate)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")

    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        with open(os.path.join(work, "valgrind.log"), "w+", encoding="utf-8") as log:
            server = subprocess.Popen(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + command,
                stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_listening(args.addr, server)
                # Keys of this run only; a replay's key is the same in the warm-up and the count.
                run = f"{os.getpid()}-{time.time_ns()}"
                load(args, args.warmup, run + ("" if args.mode == "replay" else "-warmup"))
                control("--zero", server.pid)
                load(args, args.requests, run)
                control("--dump", server.pid)
            finally:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
        dumps = [path for path in glob.glob(out + "*") if path != out]
        if len(dumps) != 1:
            sys.exit(f"expected one dump, found {dumps}")
        total = totals(dumps[0])
        if args.keep:
            shutil.copyfile(dumps[0], args.keep)
        print(total // args.requests)
        for instructions, share, name in top(dumps[0], args.top, total, args.requests):
            print(f"{instructions:>8}  {share:6.1%}  {name}")


if __name__ == "__main__":
    main()
