"""The PostgreSQL backend with several sidecars on one database: exact snapshots whatever the
interleaving, one migration however many start at once, and a database that goes away.

These run in every test session (a throwaway server, see ``support.postgres``), whichever
backend ``--backend`` chose for the other end-to-end tests.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openwop_memory.storage.postgresql import schema as postgresql_schema
from support.backends import BACKENDS, POSTGRES, Backend
from support.fleet import fleet
from support.forked import fork_command
from support.polling import wait_for
from support.postgres import PgBouncer, PostgresServer
from support.protocol import later_list
from support.sidecar import EXE, RawClient, RpcError, Sidecar
from support.store import put_request

pytestmark = pytest.mark.backend_independent

PG = BACKENDS["postgresql"]


def contents(client: RawClient, tenant: str, ref: str = "scope") -> list[str]:
    return [e["content"] for e in later_list(client, ref, tenant)]


# -- exact snapshots ------------------------------------------------------------------------


def test_a_write_in_flight_across_another_sidecars_begin(workdir: Path) -> None:
    """Sidecar A's put is held inside its transaction (a trigger sleeps after its insert)
    while sidecar B begins a run of the same tenant. B's begin waits for that write, so the
    write committed before the begin answered and the run sees it; a write sent after the
    begin answered is never seen. A run of another tenant does not wait."""
    with fleet(workdir, 2) as (a, b), a.client() as ca, b.client() as cb, b.client() as cb2:
        ca.call("run.begin", runId="writer", tenant="t")
        ca.call("run.begin", runId="other-writer", tenant="u")
        ca.call("memory.put", runId="writer", memoryRef="scope", entry={"content": "warm-up"})
        POSTGRES.psql(
            workdir / "shared",
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$;"
            " CREATE TRIGGER slow AFTER INSERT ON entries FOR EACH ROW"
            " WHEN (convert_from(NEW.content, 'UTF8') = 'slow') EXECUTE FUNCTION slow()",
        )

        def slow_put() -> None:
            ca.call("memory.put", runId="writer", memoryRef="scope", entry={"content": "slow"})

        with ThreadPoolExecutor(1) as pool:
            sent = time.monotonic()
            put = pool.submit(slow_put)
            time.sleep(0.5)  # the put is now inside its transaction, holding t's clock
            started = time.monotonic()
            cb2.call("run.begin", runId="u-run", tenant="u")
            other_tenant_wait = time.monotonic() - started
            cb.call("run.begin", runId="t-run", tenant="t")
            # The write cannot commit before its trigger's 1.5 s sleep ends. (Which of the
            # two answers reaches this process first after that is a race of two sockets.)
            begin_answered = time.monotonic() - sent
            put.result()
        assert other_tenant_wait < 0.5, "a begin of another tenant queued behind t's write"
        assert begin_answered >= 1.5, "the begin answered while t's write was in flight"
        ca.call("memory.put", runId="writer", memoryRef="scope", entry={"content": "after"})
        seen = cb.call("memory.list", runId="t-run", memoryRef="scope")
        assert [e["content"] for e in seen] == ["slow", "warm-up"]


@dataclass
class History:
    """What each worker did, with the monotonic times each call was sent and answered."""

    puts: list[tuple[str, str, float, float]] = field(default_factory=list)  # tenant, id, s, a
    deletes: list[tuple[str, str, float, float]] = field(default_factory=list)
    views: list[tuple[str, set[str], float, float]] = field(default_factory=list)
    snapshots: list[tuple[str, str, set[str]]] = field(default_factory=list)  # tenant, at, ids
    lock: threading.Lock = field(default_factory=threading.Lock)


def _worker(sidecar: Sidecar, seed: int, history: History, until: float) -> None:
    rng = random.Random(seed)
    tenants = ("t1", "t2")
    with sidecar.client() as c:
        writers = {t: f"w{seed}-{t}" for t in tenants}
        for tenant, run in writers.items():
            c.call("run.begin", runId=run, tenant=tenant)
        mine: list[tuple[str, str]] = []
        n = 0
        while time.monotonic() < until:
            tenant = rng.choice(tenants)
            roll = rng.random()
            sent = time.monotonic()
            if roll < 0.6:
                entry = c.call(
                    "memory.put", runId=writers[tenant], memoryRef="scope", entry={"content": "x"}
                )
                with history.lock:
                    history.puts.append((tenant, entry["id"], sent, time.monotonic()))
                mine.append((tenant, entry["id"]))
            elif roll < 0.7 and mine:
                tenant, victim = mine.pop(rng.randrange(len(mine)))
                if c.call("memory.delete", runId=writers[tenant], memoryRef="scope", id=victim):
                    with history.lock:
                        history.deletes.append((tenant, victim, sent, time.monotonic()))
            else:
                n += 1
                run = f"v{seed}-{n}"
                begun = c.call("run.begin", runId=run, tenant=tenant)
                answered = time.monotonic()
                listed = c.call(
                    "memory.list", runId=run, memoryRef="scope", options={"limit": 1000}
                )
                with history.lock:
                    history.views.append((tenant, {e["id"] for e in listed}, sent, answered))
                    history.snapshots.append(
                        (tenant, begun["snapshotAt"], {e["id"] for e in listed})
                    )


def run_workers(sidecars: list[Sidecar], seconds: float) -> History:
    """Two workers per sidecar writing, deleting and beginning runs for ``seconds``."""
    history = History()
    until = time.monotonic() + seconds
    workers = 2 * len(sidecars)
    with ThreadPoolExecutor(workers) as pool:
        for future in [
            pool.submit(_worker, sidecars[n % len(sidecars)], n, history, until)
            for n in range(workers)
        ]:
            future.result()
    return history


def check_views(history: History) -> int:
    """Check every run's view against real time (see the test below); the number of puts
    that had to be seen."""
    deleted = {eid: (s, a) for _, eid, s, a in history.deletes}
    checked = 0
    for tenant, view, begin_sent, begin_answered in history.views:
        for t, eid, put_sent, put_answered in history.puts:
            if t != tenant:
                assert eid not in view, "a run saw another tenant's entry"
                continue
            gone = deleted.get(eid)
            if put_sent > begin_answered:
                assert eid not in view, "a run saw a put sent after its begin answered"
            elif put_answered < begin_sent:
                if gone is None or gone[0] > begin_answered:
                    assert eid in view, "a run missed a put answered before its begin"
                    checked += 1
                elif gone[1] < begin_sent:
                    assert eid not in view, "a run saw an entry deleted before its begin"
        seen_sent = [s for t, eid, s, _ in history.puts if t == tenant and eid in view]
        if seen_sent:
            latest = max(seen_sent)
            for t, eid, _, put_answered in history.puts:
                if t == tenant and put_answered < latest and eid not in deleted:
                    assert eid in view, "a view is not closed under real-time order"
    return checked


def test_three_sidecars_views_follow_real_time(workdir: Path) -> None:
    """Three sidecars write, delete and begin runs of two tenants at once. For every run's
    view: a put answered before the begin was sent is in it (unless a delete answered
    before the begin was sent removed it), a put sent after the begin answered is not, and
    it is closed under real-time order (a put answered before a seen put was sent is seen,
    unless deleted). A run as of each view's snapshotAt, on any sidecar, sees that view."""
    with fleet(workdir, 3) as sidecars:
        history = run_workers(sidecars, 4)
        # Read-only runs as of each snapshot's time, on every sidecar in turn (the
        # deletes of the load since then included): each sees exactly that snapshot.
        with ExitStack() as stack:
            clients = [stack.enter_context(s.client()) for s in sidecars]
            for n, (tenant, at, seen) in enumerate(history.snapshots):
                c = clients[n % len(clients)]
                c.call("run.begin", runId=f"as-of-{n}", tenant=tenant, asOf=at)
                listed = c.call(
                    "memory.list", runId=f"as-of-{n}", memoryRef="scope", options={"limit": 1000}
                )
                assert {e["id"] for e in listed} == seen, (n, at)
    assert len(history.views) > 20 and len(history.puts) > 100, (
        len(history.views),
        len(history.puts),
    )
    assert check_views(history) > 100


def test_behind_a_transaction_mode_pooler(workdir: Path) -> None:
    """Two sidecars reach the database through PgBouncer in transaction mode, three server
    connections shared by all of theirs: they migrate, serve, sweep and keep snapshots
    exact (the same real-time checks as above)."""
    PG.url_for(workdir / "pooled")  # the session's server, and a database on it
    assert POSTGRES.server is not None
    name = POSTGRES.database_name(workdir / "pooled")
    with PgBouncer(POSTGRES.server) as bouncer:
        pooled = Backend("pooled", lambda _path: bouncer.url(name))
        args = ("--sweep-interval", "1s", "--postgresql-prepared-statements", "false")
        with fleet(workdir, 2, pooled, *args) as sidecars:
            history = run_workers(sidecars, 3)
            wait_for(lambda: all(_stats(s)["sweeps"] >= 1 for s in sidecars), 10, "a sweep each")
            assert all(_stats(s)["sweepFailures"] == 0 for s in sidecars)
    assert len(history.views) > 10 and len(history.puts) > 50
    assert check_views(history) > 20


def _stats(sidecar: Sidecar) -> dict[str, int]:
    with sidecar.client() as c:
        stats: dict[str, int] = c.call("sidecar.stats")
    return stats


# -- start-up -------------------------------------------------------------------------------


def test_ten_sidecars_starting_at_once_migrate_once(workdir: Path) -> None:
    """Ten sidecars started together on an empty database all come up, with one schema."""
    url = PG.url_for(workdir / "empty")
    procs = []
    for n in range(10):
        log = open(workdir / f"start-{n}.log", "wb")  # noqa: SIM115 - closed below
        argv = ["serve", "--socket", str(workdir / f"{n}.sock"), "--database", url]
        # Forked (support.forked): all ten reach the migration within milliseconds.
        procs.append((fork_command(argv, os.environ, log.fileno(), log.fileno()), log))
    try:
        for n in range(10):
            probe = Sidecar(workdir, socket_path=workdir / f"{n}.sock", backend=PG)
            wait_for(probe.ready, 30, f"sidecar {n} ready")
    finally:
        for proc, log in procs:
            proc.terminate()
            proc.wait(20)
            log.close()
    rows = POSTGRES.psql(workdir / "empty", "SELECT version FROM openwop_schema_migrations")
    assert rows.split() == [str(version) for version, _ in postgresql_schema.MIGRATIONS]
    assert all(proc.returncode == 0 for proc, _ in procs)


def test_a_newer_schema_is_refused_with_a_clear_message(workdir: Path) -> None:
    with Sidecar(workdir, database=workdir / "db", backend=PG):
        pass
    POSTGRES.psql(workdir / "db", "INSERT INTO openwop_schema_migrations (version) VALUES (999)")
    sidecar = Sidecar(workdir, database=workdir / "db", backend=PG)
    with pytest.raises(RuntimeError, match="exited with 1"):
        sidecar.start()
    assert "schema is version 999, newer than this sidecar knows" in sidecar.log()


# -- faults ---------------------------------------------------------------------------------


def _health_exit(sidecar: Sidecar) -> int:
    return subprocess.run(
        [EXE, "health", "--socket", str(sidecar.socket), "--timeout", "20"],
        capture_output=True,
        check=False,
    ).returncode


def test_the_database_going_away_under_load(workdir: Path) -> None:
    """While writers put with idempotency keys, the server crashes and stays down a while:
    calls fail fast with upstream_unavailable, health exits 1 (degraded), and once the
    server is back the sidecar recovers by itself. No acknowledged put is lost, and putting
    again with the keys of the unacknowledged ones writes each once."""
    with PostgresServer() as server:
        url = server.create_database("faults")
        backend = Backend("faults", lambda _path: url)
        args = ("--postgresql-command-timeout", "2s", "--postgresql-connect-timeout", "1s")
        with Sidecar(workdir, *args, backend=backend) as sidecar:
            acked: dict[str, str] = {}  # key → entry id
            unacked: set[str] = set()
            codes: set[str] = set()  # of the failed puts
            stop = threading.Event()

            def writer(n: int) -> None:
                with sidecar.client(timeout=30) as c:
                    c.call("run.begin", runId=f"w{n}", tenant="t")
                    for i in range(100_000):
                        if stop.is_set():
                            return
                        key = f"k{n}-{i}"
                        try:
                            entry = c.call(
                                "memory.put",
                                runId=f"w{n}",
                                memoryRef="scope",
                                entry={"content": key},
                                idempotencyKey=key,
                            )
                        except RpcError as exc:
                            codes.add(exc.code)
                            unacked.add(key)
                            time.sleep(0.01)
                        else:
                            acked[key] = entry["id"]

            with sidecar.client() as c:
                c.call("run.begin", runId="probe", tenant="t")  # before the crash
            with ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(writer, n) for n in range(4)]
                try:
                    wait_for(lambda: len(acked) > 200, 20, "writes before the crash")
                    server.stop("immediate")
                    with sidecar.client() as c:
                        started = time.monotonic()
                        err = c.error("memory.list", runId="probe", memoryRef="scope")
                        assert err.code == "upstream_unavailable", err.error
                        assert time.monotonic() - started < 3.5
                    assert _health_exit(sidecar) == 1
                    time.sleep(1)
                    server.start()
                    wait_for(lambda: _health_exit(sidecar) == 0, 20, "health ok again")
                    count = len(acked)
                    wait_for(lambda: len(acked) > count + 100, 20, "writes after recovery")
                finally:
                    stop.set()
                for f in futures:
                    f.result()
            with sidecar.client() as c:
                c.call("run.begin", runId="retry", tenant="t")
                for key in sorted(unacked):
                    c.call(
                        "memory.put",
                        runId="retry",
                        memoryRef="scope",
                        entry={"content": key},
                        idempotencyKey=key,
                    )
                c.call("run.begin", runId="final", tenant="t")
                listed = c.call(
                    "memory.list", runId="final", memoryRef="scope", options={"limit": 1000}
                )
        stored = server.psql("SELECT convert_from(content, 'UTF8') FROM entries", "faults").split()
    assert unacked, "no call failed: the server did not go away under load"
    assert codes == {"upstream_unavailable"}
    assert set(acked) <= set(stored), "an acknowledged put was lost"
    assert len(stored) == len(set(stored)), "a retried key wrote twice"
    assert set(stored) == set(acked) | unacked
    assert {e["id"] for e in listed} <= set(acked.values()) | {e["id"] for e in listed}


def test_sidecars_with_any_tenant_mix_share_memory(workdir: Path) -> None:
    """What one sidecar writes, another's new runs read, per tenant and never across."""
    with fleet(workdir, 2) as (a, b), a.client() as ca, b.client() as cb:
        for tenant in ("t1", "t2"):
            ca.call("run.begin", runId=f"w-{tenant}", tenant=tenant)
            ca.call("memory.put", runId=f"w-{tenant}", memoryRef="scope", entry={"content": tenant})
        assert contents(cb, "t1") == ["t1"]
        assert contents(cb, "t2") == ["t2"]
        assert contents(cb, "t3") == []


def test_a_database_turned_read_only_is_degraded_until_writable(workdir: Path) -> None:
    """As after a failover to a standby: reads go on, every write fails with
    upstream_unavailable, health lists writes_failing (exit 1), and once the database
    takes writes again health is ok by itself and puts go through."""
    path = workdir / "db"

    def read_only(on: bool) -> None:
        name = POSTGRES.database_name(path)
        setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
        assert POSTGRES.server is not None
        # From another database: sessions in this one may be read-only by now.
        POSTGRES.server.psql(f'ALTER DATABASE "{name}" {setting}')
        POSTGRES.server.psql(  # open connections keep their settings: make the pool reconnect
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        )

    with Sidecar(workdir, database=path, backend=PG) as sidecar, sidecar.client() as c:
        c.call("run.begin", runId="w", tenant="t")
        c.call("memory.put", runId="w", memoryRef="scope", entry={"content": "before"})
        read_only(True)
        wait_for(lambda: _put_fails(sidecar, "w"), 10, "a put to fail on the read-only database")
        health = c.call("sidecar.health")
        assert health["status"] == "degraded", health
        assert health["storage"]["problems"] == ["writes_failing"]
        assert health["storage"]["lastWriteError"] == "25006"  # read_only_sql_transaction
        assert _health_exit(sidecar) == 1
        assert [e["content"] for e in c.call("memory.list", runId="w", memoryRef="scope")] == []
        read_only(False)
        wait_for(lambda: _health_exit(sidecar) == 0, 10, "health ok again")
        c.call("memory.put", runId="w", memoryRef="scope", entry={"content": "after"})
        assert sorted(contents(c, "t")) == ["after", "before"]


def _put_fails(sidecar: Sidecar, run: str) -> bool:
    with sidecar.client() as c:
        answer = c.request(
            "memory.put", {"runId": run, "memoryRef": "scope", "entry": {"content": "x"}}
        )
    if "error" not in answer:
        return False
    assert answer["error"]["data"]["error"] == "upstream_unavailable", answer
    return True


def test_a_failed_commit_never_moves_an_entry_to_another_tenant(workdir: Path) -> None:
    """Issue 7's finding 1 on PostgreSQL: tenant A's first put to a new scope fails after
    the scope's row was written (a trigger fails the entry's insert); tenant B then writes
    its first entry to a new scope; A retries. Each entry is in its own tenant's scope, and
    stays there after a restart."""
    path = workdir / "db"
    with Sidecar(workdir, database=path, backend=PG) as sidecar, sidecar.client() as c:
        POSTGRES.psql(
            path,
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'refused'; END $$;"
            " CREATE TRIGGER refuse BEFORE INSERT ON entries FOR EACH ROW"
            " WHEN (convert_from(NEW.content, 'UTF8') = 'a') EXECUTE FUNCTION refuse()",
        )
        c.call("run.begin", runId="a", tenant="tenant-a")
        c.call("run.begin", runId="b", tenant="tenant-b")
        err = c.error("memory.put", runId="a", memoryRef="scope-a", entry={"content": "a"})
        assert err.code == "upstream_unavailable", err.error
        POSTGRES.psql(path, "DROP TRIGGER refuse ON entries")
        c.call("memory.put", runId="b", memoryRef="scope-b", entry={"content": "b"})
        c.call("memory.put", runId="a", memoryRef="scope-a", entry={"content": "a"})
        assert contents(c, "tenant-a", "scope-a") == ["a"]
        assert contents(c, "tenant-b", "scope-b") == ["b"]
    with Sidecar(workdir, database=path, backend=PG) as again, again.client() as c:
        assert contents(c, "tenant-a", "scope-a") == ["a"]
        assert contents(c, "tenant-b", "scope-b") == ["b"]
    scopes = POSTGRES.psql(path, "SELECT count(*) FROM scopes").split()
    assert scopes == ["2"], scopes


@pytest.mark.anyio
async def test_a_sidecar_with_a_skewed_clock_judges_time_by_the_database(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This host's clock an hour fast: the store's clock (what expiry and retention are
    judged by) is still the database's, and createdAt too."""
    import openwop_memory.storage.postgresql.backend as backend
    from openwop_memory.storage.base import PutOutcome, Scope
    from openwop_memory.timefmt import now_us

    hour = 3600 * 1_000_000
    monkeypatch.setattr(backend, "wall_clock_us", lambda: now_us() + hour)
    store = PG.storage(workdir / "skewed")
    await store.open()
    try:
        assert abs(store.clock_us() - now_us()) < 1_000_000
        request = put_request(Scope("t", "s"), "x")
        result = await store.put(request=request, now_us=store.clock_us())
        assert result.outcome is PutOutcome.STORED and result.entry is not None
        assert abs(result.entry.created_us - now_us()) < 1_000_000
    finally:
        await store.close()
