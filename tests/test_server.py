"""`walklens serve` (issue 16): the API through Starlette's test client on tiny random models -- the token, the
Host check, the bounds, every view's payload checked against the analysis it calls -- plus a real uvicorn
server for the cancellation of a request whose client left, and the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest
import torch
from starlette.testclient import TestClient

import walklens
from _explorer import EVIL_MODEL, EVIL_TEXT, OUTS, TEST_TEXT, sweep_db
from walklens.server import bounds
from walklens.server.app import ASSETS, Running, create_app
from walklens.server.security import allowed_hosts
from walklens.server.state import Explorer
from walklens.testing import tiny_model

HOST = "127.0.0.1:8765"
TOKEN = "test-token_0123456789"
H = {"X-Walklens-Token": TOKEN}


@pytest.fixture(scope="module")
def models():
    return {"llama": tiny_model("llama"), "gpt2": tiny_model("gpt2")}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return sweep_db(tmp_path_factory.mktemp("db") / "r.sqlite")


@pytest.fixture(scope="module")
def explorer(models, db):
    return Explorer(dict(models), db)


@pytest.fixture(scope="module")
def client(explorer):
    app = create_app(explorer, TOKEN, allowed_hosts("127.0.0.1", 8765))
    with TestClient(app, base_url=f"http://{HOST}") as c:
        yield c


def post(client, path, **body):
    return client.post(path, json=body, headers=H)


# ---- the guard -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/static/app.js", "/api/info", "/api/sweeps", "/api/nothing"])
def test_every_request_needs_the_token(client, path):
    client.cookies.clear()  # the asset cookie the page sets is the token too (tests/test_explorer_api.py)
    assert client.get(path).status_code == 403
    assert client.get(path, headers={"X-Walklens-Token": "wrong"}).status_code == 403
    assert client.get(path, params={"token": TOKEN[:-1]}).status_code == 403
    r = client.get(path, headers=H)
    assert r.status_code == (404 if path == "/api/nothing" else 200)
    assert client.get(path, params={"token": TOKEN}).status_code == r.status_code
    assert "token" in client.get(path).json()["error"]
    assert client.post("/api/walk", json={"model": "llama", "text": TEST_TEXT}).status_code == 403


def test_host_and_origin_are_checked(client):
    """DNS rebinding: a page on another name that resolves to 127.0.0.1 sends its own Host: refused."""
    for host in ("evil.example:8765", "evil.example", "127.0.0.1:8766", "localhost", ""):
        r = client.get("/api/info", headers={**H, "Host": host})
        assert r.status_code == 403 and "Host" in r.json()["error"], host
    assert client.get("/api/info", headers={**H, "Host": "localhost:8765"}).status_code == 200
    r = client.post(
        "/api/walk", json={"model": "llama", "text": TEST_TEXT}, headers={**H, "Origin": "http://evil.example:8765"}
    )
    assert r.status_code == 403 and "origin" in r.json()["error"]
    assert client.get("/api/info", headers={**H, "Origin": f"http://{HOST}"}).status_code == 200


def test_security_headers(client):
    r = client.get("/", headers=H)
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    assert client.get("/api/info").headers["x-content-type-options"] == "nosniff"  # refusals too


def test_page_loads_nothing_from_the_network(client):
    """The page and its assets name no http(s) URL but the SVG namespace (an identifier, never fetched), and
    no script puts data into markup."""
    page = client.get("/", headers=H).text
    assert TOKEN not in page  # the assets load with the page's cookie (test_explorer_api.py)
    assert not re.search(r"(https?:)?//", page), re.findall(r"\S*//\S*", page)
    refs = re.findall(r"(?:src|href)=\"([^\"]+)\"", page)
    assert refs and all(r.startswith("/static/") or r == "data:," for r in refs), refs
    assert {r.split("?")[0].rsplit("/", 1)[1] for r in refs if r.startswith("/static/")} == set(ASSETS)
    for name in ASSETS:
        text = client.get(f"/static/{name}", headers=H).text
        urls = set(re.findall(r"https?://[^\s\"')]+", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, (name, sink)
    assert client.get("/static/../app.py", headers=H).status_code == 404
    assert client.get("/static/app.py", headers=H).status_code == 404


def test_body_size_and_json_are_checked(client):
    r = client.post("/api/walk", content=b"x" * (bounds.MAX_BODY + 1), headers=H)
    assert r.status_code == 413 and "KiB" in r.json()["error"]
    r = client.post("/api/walk", content=b"{not json", headers=H)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    assert client.post("/api/walk", content=b"[1]", headers=H).status_code == 400


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"text": TEST_TEXT}, 400, "unknown model"),
        ({"model": "nope", "text": TEST_TEXT}, 400, "unknown model"),
        ({"model": "llama"}, 400, "text must be a string"),
        ({"model": "llama", "text": "   "}, 400, "text is empty"),
        ({"model": "llama", "text": "a" * (bounds.MAX_TEXT_CHARS + 1)}, 413, "at most 20,000"),
        ({"model": "llama", "text": TEST_TEXT, "norm": "both"}, 400, "norm must be one of none, final"),
        ({"model": "llama", "text": TEST_TEXT, "metric": 3}, 400, "metric must be one of"),
        ({"model": "llama", "text": " the" * 80}, 400, "context of 64"),
    ],
)
def test_walk_arguments_are_bounded(client, body, status, message):
    r = client.post("/api/walk", json=body, headers=H)
    assert r.status_code == status and message in r.json()["error"], r.text


@pytest.mark.parametrize(
    "k, ok",
    [(0, False), (1, True), (bounds.MAX_K, True), (bounds.MAX_K + 1, False), (2.5, False), ("3", False), (True, False)],
)
def test_top_k_is_bounded(client, k, ok):
    r = post(client, "/api/walk/cell", model="llama", text=TEST_TEXT, point=1, position=0, k=k)
    assert (r.status_code == 200) == ok, r.text
    if ok:
        assert len(r.json()["top_ids"]) == k
    else:
        assert r.status_code == 400 and "k must be" in r.json()["error"]


def test_token_limit_is_a_413(client, monkeypatch):
    monkeypatch.setattr("walklens.server.api_walks.MAX_TOKENS", 4)
    r = post(client, "/api/walk", model="llama", text=TEST_TEXT)
    assert r.status_code == 413 and "6 tokens; the walk view reads at most 4" in r.json()["error"]


# ---- each view's payload, checked against the analysis it calls ------------------------------------------------


def test_walk_payload_is_the_encoding_walk(client, models):
    r = post(client, "/api/walk", model="llama", text=TEST_TEXT, norm="final", metric="cosine")
    assert r.status_code == 200
    d = r.json()
    w = walklens.encoding_walk(
        walklens.capture(models["llama"], TEST_TEXT),
        k=3,
        norm="final",
        metric="cosine",
        points=["embed", "L*.resid_post", "final"],
        progress=False,
    )
    assert d["points"] == w.points == ["embed", "L0.resid_post", "L1.resid_post", "final"]
    assert d["tokens"] == w.tokens and d["block"] == 1 and d["columns"] == w.tokens
    assert d["rank_of_input"] == w.rank_of_input.tolist() and d["rank_of_next"] == w.rank_of_next.tolist()
    assert d["rank_of_next"][0][-1] == -1  # the last position has no next token
    assert d["escape_point"] == w.escape_point.tolist() and d["escape_stable"] == w.escape_stable.tolist()
    assert torch.allclose(torch.tensor(d["final"]["prob_of_next"][:-1]), w.prob_of_next[-1, :-1], atol=1e-5)
    assert d["n_vocab"] == models["llama"].embedding_matrix().shape[0]

    c = post(
        client, "/api/walk/cell", model="llama", text=TEST_TEXT, norm="final", metric="cosine", point=2, position=3, k=3
    ).json()
    assert c["point"] == "L1.resid_post" and c["token"] == " france" and c["next"] == " is"
    assert c["top_ids"] == w.top_ids[2, 3].tolist()
    assert c["top_scores"] == pytest.approx(w.top_scores[2, 3].tolist(), abs=1e-5)
    assert c["rank_of_next"] == int(w.rank_of_next[2, 3]) and c["escape_point"] == int(w.escape_point[3])
    names = walklens.analyses.walks.labels_for(models["llama"].tokenizer, w.top_ids[2, 3].tolist())
    assert [c["labels"][str(i)] for i in c["top_ids"]] == [names[i] for i in w.top_ids[2, 3].tolist()]
    r = post(client, "/api/walk/cell", model="llama", text=TEST_TEXT, point=4, position=0)
    assert r.status_code == 400 and "4 points and 6 positions" in r.json()["error"]


def test_long_walks_are_reduced_by_blocks(client, models, monkeypatch):
    """Over MAX_CELLS cells the rank maps hold the best (lowest) rank of each block of positions; -1 (no next
    token) only where a whole block has none."""
    monkeypatch.setattr(bounds, "MAX_CELLS", 8)
    d = post(client, "/api/walk", model="llama", text=TEST_TEXT).json()
    w = walklens.encoding_walk(
        walklens.capture(models["llama"], TEST_TEXT),
        k=1,
        points=["embed", "L*.resid_post", "final"],
        progress=False,
    )
    assert d["block"] == 3 and len(d["columns"]) == 2 and d["columns"][1] == "3-5  france"
    for name, full in (("rank_of_input", w.rank_of_input), ("rank_of_next", w.rank_of_next)):
        ref = [[min((v for v in row[j : j + 3] if v >= 0), default=-1) for j in (0, 3)] for row in full.tolist()]
        assert d[name] == ref, name
    assert len(d["rank_of_input"]) * len(d["rank_of_input"][0]) <= 8


def test_decode_payload_is_the_decoding_walk(client, models):
    d = post(client, "/api/decode", model="llama", text=TEST_TEXT, max_new_tokens=5, k=4).json()
    dw = walklens.decoding_walk(models["llama"], TEST_TEXT, max_new_tokens=5, k=4, progress=False)
    assert d["tokens"] == dw.tokens and d["ranks"] == dw.ranks.tolist() and d["top_tokens"] == dw.top_tokens
    assert d["prompt_tokens"] == dw.prompt_tokens and d["target"] is None
    t = post(client, "/api/decode", model="llama", text=TEST_TEXT, target=" the city").json()
    tw = walklens.decoding_walk(models["llama"], TEST_TEXT, target=" the city", progress=False)
    assert t["tokens"] == [" the", " city"] and t["in_neighbourhood"] == tw.in_neighbourhood.tolist()
    assert t["left_path_at"] == tw.left_path_at
    r = post(client, "/api/decode", model="llama", text=TEST_TEXT, max_new_tokens=bounds.MAX_NEW_TOKENS + 1)
    assert r.status_code == 400 and "max_new_tokens must be from 1 to 64" in r.json()["error"]


def test_simmap_payload(client, models, monkeypatch):
    d = post(client, "/api/simmap", model="gpt2", text=TEST_TEXT, point="L1.resid_mid", metric="dot").json()
    ref = walklens.similarity_map(walklens.capture(models["gpt2"], TEST_TEXT), "L1.resid_mid", "dot")
    assert torch.allclose(torch.tensor(d["maps"]["L1.resid_mid/dot"]), ref, atol=1e-4) and d["labels"][1] == " capital"
    monkeypatch.setattr(bounds, "MAX_CELLS", 9)
    d = post(client, "/api/simmap", model="gpt2", text=TEST_TEXT, point="V", metric="cosine").json()
    z = d["maps"]["V/cosine"]
    assert d["block"] == 2 and len(z) == 3 and len(z[0]) == 3  # 2 x 2 blocks of positions
    assert z[0][0] == pytest.approx(
        float(walklens.similarity_map(walklens.capture(models["gpt2"], TEST_TEXT), "V", "cosine")[:2, :2].mean()),
        abs=1e-4,
    )
    r = post(client, "/api/simmap", model="gpt2", text=TEST_TEXT, point="../etc")
    assert r.status_code == 400 and "captured point" in r.json()["error"]


def test_attention_payload(client, models):
    d = post(client, "/api/attention", model="llama", text=TEST_TEXT, layer=1, head=2, query=4).json()
    tr = walklens.capture(models["llama"], TEST_TEXT, attentions=True)
    assert torch.allclose(torch.tensor(d["map"]), tr.attentions["L1.attn"][2], atol=1e-5)
    cv = walklens.analyses.cluster_view(tr, walklens.head_matrices(models["llama"], 1), 2, 4, top=10)
    assert d["cluster"]["self_mass"] == pytest.approx(cv.self_mass, abs=1e-5)
    assert [m[0] for m in d["cluster"]["top_members"]] == [j for j, _, _ in cv.top_members]
    assert torch.allclose(torch.tensor(d["self_mass"]["mass"]), walklens.analyses.self_mass(tr).mass, atol=1e-5)
    assert torch.tensor(d["head_stats"]["vo_norm"]).shape == (2, 4)
    r = post(client, "/api/attention", model="llama", text=TEST_TEXT, head=4)
    assert r.status_code == 400 and "head must be from 0 to 3" in r.json()["error"]
    r = post(client, "/api/attention", model="llama", text=TEST_TEXT, layer=2)
    assert r.status_code == 400 and "layer must be from -2 to 1" in r.json()["error"]


def test_kernels_and_power_payloads(client, models):
    k = post(client, "/api/kernels", model="llama").json()
    pk = walklens.position_kernels(models["llama"], progress=False)
    s = k["stacks"][0]
    assert torch.tensor(s["log_values"]).shape[:2] == (2, 4) and s["distances"] == pk.stacks[0].distances
    assert torch.allclose(torch.tensor(s["log_values"]), pk.stacks[0].log_values.float(), atol=1e-5)
    p = post(client, "/api/power", model="llama", text=TEST_TEXT).json()
    al = walklens.alignment(models["llama"], TEST_TEXT)
    assert p["alignment"]["points"] == al.points
    assert p["alignment"]["mean"] == pytest.approx(al.mean, abs=1e-5)
    assert p["alignment"]["random_lo"] == pytest.approx(al.random_lo, abs=1e-5)
    layers = p["spectra"]["layers"]
    assert len(layers) == 2 and len(layers[0]["eigenvalues"]) == 8 and "v1" not in layers[0]  # no [D] vectors


def test_steer_payload_is_the_steering_sweep(client, models):
    d = post(
        client,
        "/api/steer",
        model="llama",
        text=TEST_TEXT,
        target=" paris",
        layers=[-1],
        alpha=50.0,
        method="add",
        max_new_tokens=4,
    ).json()
    sw = walklens.analyses.steering_sweep(
        models["llama"], TEST_TEXT, " paris", [[1]], [0.0, 50.0], methods=["add"], max_new_tokens=4
    )
    unsteered, steered = d["rows"]
    assert d["layer_sets"] == [[1]] and unsteered["text"] == sw.rows[0].text and steered["text"] == sw.rows[1].text
    assert steered["target_rank"] == sw.rows[1].target_rank and steered["alpha"] == 50.0
    assert steered["push"] == pytest.approx(50.0, rel=1e-3)  # activation addition pushes exactly alpha
    for body, msg in (
        ({"alpha": float("1e7")}, "alpha must be within"),
        ({"layers": [2]}, "every layer"),
        ({"layers": []}, "list of 1 to 2"),
        ({"method": "rm"}, "method must be one of"),
        ({"max_new_tokens": 33}, "max_new_tokens must be from 1 to 32"),
    ):
        args = {"model": "llama", "text": TEST_TEXT, "target": " paris", "layers": [1], "alpha": 1.0, **body}
        r = client.post("/api/steer", json=args, headers=H)
        assert r.status_code == 400 and msg in r.json()["error"], (body, r.text)
    # the model is restored after steering: the walk is the one computed before
    assert (
        post(client, "/api/decode", model="llama", text=TEST_TEXT, max_new_tokens=3).json()["tokens"]
        == walklens.decoding_walk(models["llama"], TEST_TEXT, max_new_tokens=3, progress=False).tokens
    )


def test_sweeps_browse_filter_and_held_out_best(client, db):
    from walklens.lab.experiments.summary import summarise_run
    from walklens.lab.hellaswag.store import SweepStore

    runs = client.get("/api/sweeps", headers=H).json()
    assert runs["db"] and runs["name"] == "r.sqlite" and runs["runs"][0]["model"] == EVIL_MODEL
    rid = runs["runs"][0]["id"]
    d = post(client, "/api/sweeps/run", run=rid).json()
    assert d["n_schemes"] == d["n_matching"] == 18 and d["parameters"]["layer"] == ["-1", "0", "E"]
    with SweepStore(db, readonly=True) as st:
        ref = summarise_run(st.load_counts(rid)).metrics["acc"]
    assert [t["scheme"] for t in d["summary"]["top10"]] == [t.scheme for t in ref.top10]
    assert d["summary"]["kfold"]["acc"] == pytest.approx(ref.kfold.acc, abs=1e-5)
    assert d["summary"]["distribution"]["hist"] == list(ref.distribution.hist)
    f = post(client, "/api/sweeps/run", run=rid, filters={"layer": "E", "out_layer": "-1"}).json()
    assert f["n_matching"] == 2 and all(
        "layer=E," in t["scheme"] and OUTS[0] in t["scheme"] for t in f["summary"]["top10"]
    )
    assert sum(f["summary"]["distribution"]["hist"]) == 2
    for body, status, msg in (
        ({"run": rid + 7}, 400, "no sweep run"),
        ({"run": rid, "filters": {"bogus": "1"}}, 400, "unknown scheme parameter"),
        ({"run": rid, "filters": {"layer": "7"}}, 400, "no scheme"),
        ({"run": rid, "metric": "f1"}, 400, "metric must be one of acc"),
        ({"run": rid, "filters": ["layer"]}, 400, "filters must be"),
    ):
        r = client.post("/api/sweeps/run", json=body, headers=H)
        assert r.status_code == status and msg in r.json()["error"], (body, r.text)


def test_without_a_database(models):
    app = create_app(Explorer({"llama": models["llama"]}), TOKEN, {HOST})
    with TestClient(app, base_url=f"http://{HOST}") as c:
        assert c.get("/api/sweeps", headers=H).json() == {"db": False, "runs": []}
        r = c.post("/api/sweeps/run", json={"run": 1}, headers=H)
        assert r.status_code == 404 and "--db" in r.json()["error"]
        assert c.get("/api/info", headers=H).json()["db"] is False


def test_strings_are_json_data_and_errors_do_not_echo(client):
    """Database strings travel verbatim as JSON data (never an HTML response; the page inserts them as text:
    see the browser test), and an error never echoes what the request sent."""
    r = client.get("/api/sweeps", headers=H)
    assert r.headers["content-type"] == "application/json" and r.json()["runs"][0]["model"] == EVIL_MODEL
    for body in (
        {"model": EVIL_TEXT, "text": "x"},
        {"model": "llama", "text": TEST_TEXT, "norm": EVIL_TEXT},
        {"model": "llama", "text": TEST_TEXT, "point": EVIL_TEXT},
    ):
        e = client.post("/api/walk/cell" if "point" in body else "/api/walk", json=body, headers=H)
        assert e.status_code == 400 and e.headers["content-type"] == "application/json"
        assert "<" not in e.json()["error"], e.text


# ---- a real server: a superseded request whose client left is never computed -----------------------------------


def test_disconnected_client_is_not_computed(models):
    ex = Explorer({"llama": models["llama"]})
    with Running(ex) as srv:
        base = srv.url.split("/?")[0]
        h = {"X-Walklens-Token": srv.token}
        ex.locks["llama"].acquire()  # the model is busy: the next job waits for it
        try:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{base}/api/walk", json={"model": "llama", "text": TEST_TEXT}, headers=h, timeout=0.5)
            time.sleep(0.3)  # the client has closed its connection
        finally:
            ex.locks["llama"].release()
        for _ in range(100):
            counts = httpx.get(f"{base}/api/status", headers=h).json()
            if counts["cancelled"]:
                break
            time.sleep(0.05)
        assert counts == {"computed": 0, "cancelled": 1, "refused": 0, "failed": 0}
        assert len(ex.traces) == 0 and len(ex.results) == 0  # nothing was captured for it
        assert httpx.post(f"{base}/api/walk", json={"model": "llama", "text": TEST_TEXT}, headers=h).status_code == 200
        assert httpx.get(f"{base}/api/status", headers=h).json()["computed"] == 1
        assert httpx.get(f"{base}/api/info", headers={**h, "Host": "rebound.example"}).status_code == 403


# ---- the command line ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (("--host", "0.0.0.0"), "--host 0.0.0.0 is not a loopback address"),
        (("--host", "192.168.1.5", "--port", "1"), "not a loopback address"),
        (("--port", "70000"), "--port must be from 0 to 65535"),
        (("--db", "/nonexistent/r.sqlite"), "--db /nonexistent/r.sqlite: no such database file"),
        (("--db", "DAMAGED"), "not a usable SQLite database"),
    ],
)
def test_cli_refuses_in_one_line(args, message, capsys, tmp_path, monkeypatch):
    from walklens.cli import main

    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)

    # cli.common first: importing it after loading.load_model is patched would bind the patch into it for good
    for where in ("walklens.cli.common.load_model", "walklens.core.loading.load_model"):
        monkeypatch.setattr(where, lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["serve", *[str(bad) if a == "DAMAGED" else a for a in args]]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("walklens: error: ") and message in err, err


@pytest.mark.slow
def test_cli_serves_and_prints_one_url(saved_model, db):
    folder = saved_model(tiny_model("llama"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "walklens", "serve", "--model", str(folder), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        line = proc.stdout.readline().strip()
        m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]{40,})", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        base, token = f"http://127.0.0.1:{m.group(1)}", m.group(2)
        info = httpx.get(f"{base}/api/info", params={"token": token}).json()
        assert info["db"] and info["models"][0]["n_layers"] == 2
        assert httpx.get(f"{base}/api/info").status_code == 403
        page = httpx.get(line)
        assert token not in page.text and "HttpOnly" in page.headers["set-cookie"]  # assets open with the cookie
        r = httpx.post(
            f"{base}/api/walk",
            json={"model": info["models"][0]["name"], "text": TEST_TEXT},
            headers={"X-Walklens-Token": token},
            timeout=60,
        )
        assert r.status_code == 200 and len(r.json()["points"]) == 4
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert out == "" and "Traceback" not in err  # one URL, nothing else on stdout


def test_payload_is_compact_json(client):
    r = post(client, "/api/walk", model="llama", text=TEST_TEXT)
    assert r.content == json.dumps(json.loads(r.content), separators=(",", ":"), ensure_ascii=False).encode()
