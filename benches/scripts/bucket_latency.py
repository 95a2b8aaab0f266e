#!/usr/bin/env python3
"""A fully cached run against a bucket that is some milliseconds away: moto's S3 server on
127.0.0.1 behind a proxy that holds every request for DELAY_MS before passing it on (a bucket
in another region, or across the internet). The 100-stage shell chain of `cached_chain_ab.py`
runs cold once per binary (each into its own prefix of the bucket); then `rao run` (fully
cached) and `rao status` of OLD and NEW alternate, ROUNDS times; prints the wall times.

    benches/scripts/bucket_latency.py OLD_RAO NEW_RAO [DELAY_MS] [ROUNDS]

Needs moto[server] (`scripts/test` installs it in target/py).
"""
import asyncio, os, socket, statistics, subprocess, sys, tempfile, threading, time

old, new = sys.argv[1], sys.argv[2]
delay = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.010
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
python = os.environ.get("RAO_PYTHON", os.path.join(os.path.dirname(__file__), "../../target/py/bin/python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


moto_port, proxy_port = free_port(), free_port()
moto = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def pipe(reader, writer, hold):
    try:
        while data := await reader.read(65536):
            if hold:
                await asyncio.sleep(hold)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def handle(client_r, client_w):
    up_r, up_w = await asyncio.open_connection("127.0.0.1", moto_port)
    # Requests wait `delay` on the way in; answers come back at once (one round trip's latency).
    await asyncio.gather(pipe(client_r, up_w, delay), pipe(up_r, client_w, 0))


def serve():
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", proxy_port)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


threading.Thread(target=serve, daemon=True).start()
try:
    t0 = time.time()
    while True:
        try:
            socket.create_connection(("127.0.0.1", moto_port)).close()
            break
        except OSError:
            assert time.time() - t0 < 30, "moto did not start"
            time.sleep(0.1)
    work = tempfile.mkdtemp(prefix="rao-bucket-")
    lines = ["name: chain", "stages:", "  s0: {kind: shell, params: {command: 'echo 0 > ${outputs.out}/o.txt'}, outputs: [out]}"]
    for i in range(1, 100):
        lines.append(f"  s{i}: {{kind: shell, inputs: {{prev: s{i-1}.out}}, params: {{command: 'echo {i} > ${{outputs.out}}/o.txt'}}, outputs: [out]}}")
    with open(os.path.join(work, "p.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(["curl", "-s", "-X", "PUT", f"http://127.0.0.1:{moto_port}/bench"], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
               AWS_ENDPOINT=f"http://127.0.0.1:{proxy_port}", AWS_ALLOW_HTTP="true")
    store = {old: ["--store", "s3://bench/old"], new: ["--store", "s3://bench/new"]}

    def timed(cmd):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t

    cold = [timed([b, "run", "p.yaml", *store[b]]) for b in (old, new)]
    print(f"cold `rao run`, 100 stages, {delay * 1000:.0f} ms a request: {cold[0]:.2f} s → {cold[1]:.2f} s")
    times = {(b, c): [] for b in (old, new) for c in ("run", "status")}
    for _ in range(rounds):
        for b in (old, new):
            for c in ("run", "status"):
                times[(b, c)].append(timed([b, c, "p.yaml", *store[b]]))
    for c in ("run", "status"):
        o, n = statistics.median(times[(old, c)]), statistics.median(times[(new, c)])
        print(f"cached `rao {c}`, 100 stages: {o:.2f} s → {n:.2f} s ({o / n:.1f}×), medians of {rounds}")
finally:
    moto.kill()
