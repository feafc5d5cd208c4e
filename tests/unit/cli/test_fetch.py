"""`voicebias fetch`: the hub weights of system cards, from a fake hub on loopback that speaks
huggingface_hub's protocol (tests/fakes/hf_hub_server.py).

The fake repository `acme/tiny-speech` holds two commits with different bytes under the same
names; `main` points at the newer one. A card pinned to the older commit must get the older
bytes, and the manifest must record the commit the hub answered with (X-Repo-Commit)."""

import hashlib
import json

import pytest
import yaml

from tests.fakes.hf_hub_server import FakeHub, FakeRepo
from voicebias import cli, config
from voicebias.cards import load_card, validate_weights
from voicebias.errors import ConfigError

OLD, NEW = "a" * 40, "b" * 40
OLD_FILES = {
    "config.json": b'{"hidden_size": 8}\n',
    "model.safetensors": b"OLD-WEIGHTS" * 50,
    "sub/tokenizer.json": b'{"v": 1}\n',
}
NEW_FILES = {
    "config.json": b'{"hidden_size": 16}\n',
    "model.safetensors": b"NEW-WEIGHTS" * 70,
    "sub/tokenizer.json": b'{"v": 2}\n',
    "extra.txt": b"only in main\n",
}
SECRET = "hf_fakeTokenThatMustNeverBePrinted123"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def hub():
    repos = [
        FakeRepo("acme/tiny-speech", {OLD: OLD_FILES, NEW: NEW_FILES}, refs={"main": NEW, "v1": OLD}),
        FakeRepo(
            "acme/vocoder", {"c" * 40: {"vocoder.pt": b"VOCODER" * 30, "config.json": b"{}\n"}}, refs={"main": "c" * 40}
        ),
        FakeRepo(
            "acme/gated-speech",
            {"d" * 40: {"config.json": b"{}\n", "model.safetensors": b"G" * 100}},
            refs={"main": "d" * 40},
            gated=True,
        ),
    ]
    with FakeHub(repos) as h:
        yield h


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    """HF_ENDPOINT at the fake hub, the hub cache and home in tmp_path, cards in tmp_path/cards."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cards = tmp_path / "cards"
    cards.mkdir()
    monkeypatch.setattr(config, "CARDS_DIR", cards)
    return cards


def write_card(cards, name, weights, folder=None):
    card = {
        "name": name,
        "adapter": "reference",
        "checkpoint": "test",
        "revision": "see weights",
        "output_voice": {"en": "x"},
        "licence": "test",
        "memory": "none",
        "requires": {"weights": f"models/weights/{folder or name}"},
        "weights": weights,
    }
    (cards / f"{name}.yaml").write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")


def run(capsys, *argv):
    rc = cli.main(["fetch", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def manifest(dest):
    return json.loads((dest / "fetched.json").read_text(encoding="utf-8"))["systems"]


def test_pinned_revision_arrives_and_the_resolved_commit_is_recorded(env, hub, tmp_path, capsys):
    write_card(
        env,
        "tiny",
        [
            {
                "repo_id": "acme/tiny-speech",
                "revision": OLD,
                "files": ["config.json", "model.safetensors"],
                "sha256": {"model.safetensors": sha(OLD_FILES["model.safetensors"])},
            },
            {"repo_id": "acme/vocoder", "revision": "main", "pinned": False, "subdir": "vocoder"},
        ],
        folder="Tiny-Model",
    )
    dest = tmp_path / "weights"
    rc, out, err = run(capsys, "tiny", "--dest", dest)
    assert rc == 0, err
    folder = dest / "Tiny-Model"
    # the pinned commit's bytes, not main's, for a regular file and an LFS file (through the CDN redirect)
    assert (folder / "config.json").read_bytes() == OLD_FILES["config.json"]
    assert (folder / "model.safetensors").read_bytes() == OLD_FILES["model.safetensors"]
    assert not (folder / "sub").exists() and not (folder / "extra.txt").exists()  # only the files listed
    assert hub.requests("CDN-GET", sha(OLD_FILES["model.safetensors"]))
    assert not hub.requests("CDN-GET", sha(NEW_FILES["model.safetensors"]))
    # the unpinned entry: whole repository listed through the model info API, into its subdir, with a warning
    assert (folder / "vocoder" / "vocoder.pt").read_bytes() == b"VOCODER" * 30
    assert hub.requests("GET", "/api/models/acme/vocoder/revision/main")
    warnings = [line for line in err.splitlines() if "is not pinned" in line]
    assert len(warnings) == 1 and "acme/vocoder" in warnings[0]
    m = manifest(dest)["tiny"]["weights"]
    assert m[0]["repo_id"] == "acme/tiny-speech" and m[0]["revision"] == OLD and m[0]["pinned"] is True
    assert m[0]["commit"] == OLD
    assert m[0]["files"]["model.safetensors"] == {
        "sha256": sha(OLD_FILES["model.safetensors"]),
        "size": len(OLD_FILES["model.safetensors"]),
    }
    assert m[0]["files"]["config.json"]["sha256"] == sha(OLD_FILES["config.json"])
    assert m[1]["revision"] == "main" and m[1]["pinned"] is False and m[1]["commit"] == "c" * 40
    assert set(m[1]["files"]) == {"config.json", "vocoder.pt"}


def test_branch_resolves_to_its_commit_and_every_file_comes_from_it(env, hub, tmp_path, capsys):
    write_card(
        env, "tiny", [{"repo_id": "acme/tiny-speech", "revision": "v1", "pinned": False, "allow_patterns": ["*.json"]}]
    )
    dest = tmp_path / "w"
    rc, out, err = run(capsys, "tiny", "--dest", dest)
    assert rc == 0, err
    m = manifest(dest)["tiny"]["weights"][0]
    assert m["commit"] == OLD and set(m["files"]) == {"config.json", "sub/tokenizer.json"}
    assert (dest / "tiny" / "sub" / "tokenizer.json").read_bytes() == OLD_FILES["sub/tokenizer.json"]
    # after resolving v1, the downloads name the commit itself
    gets = [r.path for r in hub.requests("GET", "/resolve/")]
    assert gets and all(f"/resolve/{OLD}/" in p for p in gets)


def test_checksum_mismatch_is_refused_and_the_file_deleted(env, hub, tmp_path, capsys):
    wrong = "0" * 64
    write_card(
        env,
        "tiny",
        [
            {
                "repo_id": "acme/tiny-speech",
                "revision": OLD,
                "files": ["model.safetensors"],
                "sha256": {"model.safetensors": wrong},
            }
        ],
    )
    dest = tmp_path / "w"
    rc, out, err = run(capsys, "tiny", "--dest", dest)
    assert rc == 1
    assert not (dest / "tiny" / "model.safetensors").exists()
    assert "model.safetensors" in err and wrong in err and sha(OLD_FILES["model.safetensors"]) in err
    assert "Traceback" not in err
    assert not (dest / "fetched.json").exists()  # nothing fetched completely, nothing recorded


@pytest.mark.parametrize("token", [None, SECRET])
def test_gated_repo_gives_the_hubs_message_and_others_still_succeed(env, hub, tmp_path, capsys, monkeypatch, token):
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    write_card(env, "locked", [{"repo_id": "acme/gated-speech", "revision": "main", "pinned": False}])
    write_card(env, "tiny", [{"repo_id": "acme/tiny-speech", "revision": OLD, "files": ["config.json"]}])
    dest = tmp_path / "w"
    rc, out, err = run(capsys, "locked", "tiny", "--dest", dest)
    assert rc == 1
    assert "Traceback" not in err and "Traceback" not in out
    line = next(x for x in err.splitlines() if "locked FAILED" in x)
    if token:
        assert "not in the authorized list" in line and "403" in line
        assert hub.requests("HEAD", "gated-speech/resolve")[0].token  # the token was sent ...
    else:
        assert "You must have access to it and be authenticated" in line and "401" in line
    assert "gated" in line and "accept the licence" in line and "HF_TOKEN" in line
    assert (dest / "tiny" / "config.json").read_bytes() == OLD_FILES["config.json"]
    m = manifest(dest)
    assert set(m) == {"tiny"} and m["tiny"]["weights"][0]["commit"] == OLD
    assert not (dest / "locked").exists() or not any(
        p.is_file() and ".cache" not in p.parts for p in (dest / "locked").rglob("*")
    )
    # ... but never printed or written
    assert SECRET not in out + err and SECRET not in (dest / "fetched.json").read_text()


def test_dry_run_downloads_nothing(env, hub, tmp_path, capsys):
    write_card(
        env,
        "tiny",
        [
            {"repo_id": "acme/tiny-speech", "revision": OLD},
            {"repo_id": "acme/vocoder", "revision": "main", "pinned": False},
        ],
    )
    dest = tmp_path / "w"
    rc, out, err = run(capsys, "tiny", "--dry-run", "--dest", dest)
    assert rc == 0, err
    assert not dest.exists()
    assert not hub.requests("GET", "/resolve/") and not hub.requests("CDN-GET")
    assert f"commit {OLD}" in out and "would download 3 file(s)" in out and "model.safetensors" in out
    assert "dry run" in err and "not pinned" in err


def test_systems_without_hub_weights_are_skipped_not_failed(env, hub, tmp_path, capsys):
    write_card(env, "tiny", [{"repo_id": "acme/tiny-speech", "revision": OLD, "files": ["config.json"]}])
    write_card(env, "by_form", None)
    rc, out, err = run(capsys, "by_form", "tiny", "--dest", tmp_path / "w")
    assert rc == 0, err
    assert "by_form: nothing to fetch" in err and "tiny ok" in err


def test_missing_repository_and_file_fail_with_plain_words(env, hub, tmp_path, capsys):
    write_card(
        env, "nope", [{"repo_id": "acme/does-not-exist", "revision": "main", "pinned": False, "files": ["config.json"]}]
    )
    write_card(env, "nofile", [{"repo_id": "acme/tiny-speech", "revision": OLD, "files": ["missing.bin"]}])
    rc, out, err = run(capsys, "nope", "nofile", "--dest", tmp_path / "w")
    assert rc == 1 and "Traceback" not in err
    assert "acme/does-not-exist@main" in err and "not found" in err
    assert "missing.bin" in err and "not in the repository" in err


def test_manifest_keeps_other_systems(env, hub, tmp_path, capsys):
    write_card(env, "one", [{"repo_id": "acme/tiny-speech", "revision": OLD, "files": ["config.json"]}])
    write_card(env, "two", [{"repo_id": "acme/vocoder", "revision": "main", "pinned": False, "files": ["config.json"]}])
    dest = tmp_path / "w"
    assert run(capsys, "one", "--dest", dest)[0] == 0
    assert run(capsys, "two", "--dest", dest)[0] == 0
    assert set(manifest(dest)) == {"one", "two"}


def test_shipped_cards_load_and_unpinned_entries_say_so():
    for name in ("qwen_omni", "kimi_audio", "glm4_voice", "step_audio2", "speechgpt", "vae_gslm"):
        weights = load_card(name)["weights"]
        assert weights, name
        for e in weights:
            assert "/" in e["repo_id"]
            assert e["pinned"] is (len(e["revision"]) == 40)
    # SpiritLM's weights come by request form, not from the hub
    assert not load_card("spiritlm_base").get("weights")


@pytest.mark.parametrize(
    "entries, message",
    [
        ("acme/x", "must be a list"),
        (["acme/x"], "must be a mapping"),
        ([{"revision": "main"}], "repo_id must be a hub id"),
        ([{"repo_id": "not a repo", "revision": "main"}], "repo_id must be a hub id"),
        ([{"repo_id": "acme/x"}], "revision must be"),
        (
            [{"repo_id": "acme/x", "revision": "main"}],
            "is not a commit (40 lowercase hex digits); pin one, or write pinned: false",
        ),
        ([{"repo_id": "acme/x", "revision": "A" * 40}], "is not a commit"),
        ([{"repo_id": "acme/x", "revision": "main", "pinned": True}], "pinned: true needs"),
        ([{"repo_id": "acme/x", "revision": "main", "pinned": "no"}], "pinned must be true or false"),
        ([{"repo_id": "acme/x", "revision": OLD, "colour": "red"}], "unknown key(s) ['colour']"),
        ([{"repo_id": "acme/x", "revision": OLD, "files": ["a"], "allow_patterns": ["*"]}], "not both"),
        ([{"repo_id": "acme/x", "revision": OLD, "files": "a.bin"}], "files must be a non-empty list"),
        ([{"repo_id": "acme/x", "revision": OLD, "files": ["../a.bin"]}], "relative path inside"),
        ([{"repo_id": "acme/x", "revision": OLD, "subdir": "/abs"}], "relative path inside"),
        ([{"repo_id": "acme/x", "revision": OLD, "sha256": {"a.bin": "xyz"}}], "64 hex digits"),
        (
            [{"repo_id": "acme/x", "revision": OLD, "files": ["a.bin"], "sha256": {"b.bin": "0" * 64}}],
            "not in its files",
        ),
    ],
)
def test_malformed_weights_entries_are_refused_by_name(entries, message):
    with pytest.raises(ConfigError) as exc:
        validate_weights(entries, "system card x.yaml")
    assert message in str(exc.value) and "x.yaml" in str(exc.value)


def test_malformed_card_fails_the_command_in_one_line(env, hub, tmp_path, capsys):
    write_card(env, "bad", [{"repo_id": "acme/x", "revision": "main"}])
    rc, out, err = run(capsys, "bad", "--dest", tmp_path / "w")
    assert rc == 1 and "bad FAILED" in err and "weights[0] (acme/x)" in err and "Traceback" not in err


def test_validate_weights_defaults_pinned_from_the_revision():
    [e] = validate_weights([{"repo_id": "acme/x", "revision": OLD.upper().lower()}], "c")
    assert e == {"repo_id": "acme/x", "revision": OLD, "pinned": True}


def test_a_failed_fetch_removes_what_it_wrote_and_keeps_what_was_there(env, hub, tmp_path, capsys):
    """The second repository of a card fails after the first arrived: the system's folder is left as
    it was before the run (its earlier file kept), with no partial download or hub bookkeeping."""
    write_card(
        env,
        "tiny",
        [
            {"repo_id": "acme/vocoder", "revision": "c" * 40, "subdir": "vocoder"},
            {"repo_id": "acme/tiny-speech", "revision": OLD, "files": ["config.json", "missing.bin"]},
        ],
    )
    dest = tmp_path / "w"
    (dest / "tiny").mkdir(parents=True)
    (dest / "tiny" / "notes.txt").write_text("mine\n", encoding="utf-8")
    rc, out, err = run(capsys, "tiny", "--dest", dest)
    assert rc == 1 and "missing.bin" in err
    assert "partly fetched file(s) of this run removed" in err
    left = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
    assert left == ["tiny", "tiny/notes.txt"]
    # a system whose folder did not exist leaves none behind
    rc, _, _ = run(capsys, "tiny", "--dest", tmp_path / "fresh")
    assert rc == 1 and not (tmp_path / "fresh" / "tiny").exists()


def test_pin_writes_the_resolved_commit_and_every_files_sha256_into_the_card(env, hub, tmp_path, capsys):
    card = env / "tiny.yaml"
    write_card(
        env,
        "tiny",
        [{"repo_id": "acme/tiny-speech", "revision": "main", "pinned": False, "allow_patterns": ["*.json"]}],
    )
    card.write_text("# the tiny test system\n" + card.read_text(encoding="utf-8"), encoding="utf-8")
    dest = tmp_path / "w"
    rc, out, err = run(capsys, "tiny", "--dest", dest, "--pin")
    assert rc == 0, err
    assert "pinned" in err and f"revision main -> {NEW}" in err
    assert card.read_text(encoding="utf-8").startswith("# the tiny test system\n")  # comments kept
    entry = load_card("tiny", env)["weights"][0]
    assert entry["revision"] == NEW and entry["pinned"] is True
    assert entry["sha256"] == {n: sha(NEW_FILES[n]) for n in ("config.json", "sub/tokenizer.json")}
    # the pinned card fetches by commit and verifies every file against the card
    capsys.readouterr()
    rc, out, err = run(capsys, "tiny", "--dest", tmp_path / "again", "--pin")
    assert rc == 0, err
    assert out.count("(matches the card)") == 2 and "already pinned to what was fetched" in err
    gets = [r.path for r in hub.requests("GET", "/resolve/")]
    assert all(f"/resolve/{NEW}/" in p for p in gets)
