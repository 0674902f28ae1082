"""`airgate run`, `ls`, `ps` against a real `airgate serve` (echo engine, one for the module):
the chat driven through a pseudo-terminal as a person types it (turns, history, `/set`,
`/clear`, multi-line input, errors, `/bye`, Ctrl-D), the one-shot forms (an argument, stdin),
the failures (no server, no key, an unknown model), the model lists, and what stays behind:
nothing in HOME (no history file), no prompt in the server's log or data directory.

The echo engine answers " tok0 tok1 ..." (`num_predict` tokens, up to the end of the context;
without it, 16) and counts a chat's prompt as 1 + (characters of all its messages) // 4 tokens: the
count `/set verbose` shows proves which history was sent.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import pty
import select
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from server_process import (
    EXIT_DEADLINE_S,
    Server,
    add_test_keys,
    clean_env,
    free_port,
    run_cli,
    start_server,
    stop_and_check,
)

pytestmark = pytest.mark.e2e

CONFIG = """
[policy]
path = "{policy}"

[[models]]
id = "echo"
engine = "echo"

[[models]]
id = "long"
engine = "echo"
context_length = 1048576
"""
# no caps: with num_predict 1000000, "long" answers a million tokens, long enough to be stopped
# with Ctrl-C (without num_predict the echo engine stops at 16: done before the signal lands)
POLICY = """
name = "run"

[[rules]]
name = "apps"
roles = ["app"]
models = ["*"]
"""
ANSWER = "".join(f" tok{i}" for i in range(16))
SHORT = "".join(f" tok{i}" for i in range(4))


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("run-cli")
    (root / "policy.toml").write_text(POLICY)
    (root / "airgate.toml").write_text(CONFIG.format(policy=root / "policy.toml"))
    add_test_keys(root / "data", ("app",))
    server = start_server(
        root / "data", root / "server.log", {"AIRGATE_CONFIG": str(root / "airgate.toml")}
    )
    yield server
    stop_and_check(server)


def client_env(server: Server, home: Path, key: str | None = None) -> dict[str, str]:
    """A client's environment: the server and its app key, and a HOME (and XDG dirs) of its
    own, so that anything it writes there is seen."""
    home.mkdir(exist_ok=True)
    env = {
        "AIRGATE_HOST": server.base_url,
        "AIRGATE_API_KEY": server.key() if key is None else key,
        "HOME": str(home),
        "TERM": "dumb",
    }
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        env[name] = str(home / name.lower())
    return env


def airgate_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


def prompt_count(n: int) -> str:
    return f"prompt eval count:    {n} token(s)"


def tokens(*messages: str) -> int:
    """The echo engine's prompt count for a chat of `messages`."""
    return 1 + sum(len(m) for m in messages) // 4


def _as_in_a_terminal() -> None:
    """SIGINT handled, as in a terminal's foreground job: a test run started in the background
    has it ignored, and an ignored signal stays ignored across exec (Python then keeps it so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """`airgate run` on a pseudo-terminal: type lines, read what it shows."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        main, side = pty.openpty()
        self.process = subprocess.Popen(
            args,
            stdin=side,
            stdout=side,
            stderr=side,
            env=clean_env(env),
            preexec_fn=_as_in_a_terminal,
        )
        os.close(side)
        self.fd = main
        self.buffer = ""

    def expect(self, text: str, deadline_s: float = 60.0) -> str:
        """Everything shown up to and including `text` (waiting for it), newlines as \\n."""
        end = time.monotonic() + deadline_s
        while text not in self.buffer:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} not shown within {deadline_s}s: {self.buffer!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # the other side closed
                    data = b""
                if not data:
                    raise AssertionError(f"exited before showing {text!r}: {self.buffer!r}")
                self.buffer += data.decode(errors="replace").replace("\r\n", "\n")
        cut = self.buffer.index(text) + len(text)
        shown, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return shown

    def say(self, line: str) -> str:
        """Type `line` at the prompt; what it shows until the next prompt."""
        os.write(self.fd, line.encode() + b"\n")
        return self.expect(">>> ")

    def exit_code(self) -> int:
        try:
            return self.process.wait(timeout=EXIT_DEADLINE_S)
        finally:
            os.close(self.fd)


def test_a_chat_on_a_terminal(echo_server: Server, tmp_path: Path) -> None:
    home = tmp_path / "home"
    term = Terminal(airgate_cmd("run", "echo"), client_env(echo_server, home))
    try:
        term.expect(">>> ")
        assert "Set 'verbose' mode." in term.say("/set verbose")
        assert "Set parameter 'num_predict' to '16'" in term.say("/set parameter num_predict 16")
        first = term.say("hello there")
        assert f"{ANSWER}\n" in first and prompt_count(tokens("hello there")) in first
        second = term.say("again")  # the history went with it
        assert f"{ANSWER}\n" in second
        assert prompt_count(tokens("hello there", ANSWER, "again")) in second

        assert "Set parameter 'num_predict' to '4'" in term.say("/set parameter num_predict 4")
        assert "num_predict" in term.say("/show")
        short = term.say("short")
        assert f"{SHORT}\n" in short and "tok4" not in short and "tok15" not in short
        assert "eval count:           4 token(s)" in short

        assert "Cleared session context" in term.say("/clear")
        cleared = term.say("again")
        assert prompt_count(tokens("again")) in cleared

        os.write(term.fd, b'"""first line\n')
        term.expect("... ")
        multi = term.say('second line"""')
        assert prompt_count(tokens("again", SHORT, "first line\nsecond line")) in multi

        assert "Unknown command" in term.say("/nonsense")
        assert "Couldn't set parameter" in term.say("/set parameter nonsense 1")
        assert "/bye" in term.say("/?")
        refused = term.say("/set parameter temperature 5")
        refused += term.say("hi")  # the server refuses: one line, and the chat goes on
        assert "Error: " in refused and "temperature" in refused and "tok0" not in refused
        os.write(term.fd, b"/bye\n")
        assert term.exit_code() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
            term.process.wait()
    assert [p for p in home.rglob("*")] == []  # no history file, nothing at all


def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(echo_server: Server, tmp_path: Path) -> None:
    term = Terminal(airgate_cmd("run", "long"), client_env(echo_server, tmp_path / "home"))
    try:
        term.expect(">>> ")
        assert "Set 'verbose' mode." in term.say("/set verbose")
        assert "Set parameter" in term.say("/set parameter num_predict 1000000")
        os.write(term.fd, b"a million tokens, please\n")
        term.expect(" tok0")
        # the terminal's own Ctrl-C: SIGINT to the command (the pty is not its controlling tty)
        term.process.send_signal(signal.SIGINT)
        term.expect(">>> ", deadline_s=120)  # the rest of the answer (already sent) drained
        assert "Set parameter" in term.say("/set parameter num_predict 4")
        after = term.say("hi")
        assert f"{SHORT}\n" in after
        assert prompt_count(tokens("hi")) in after  # the stopped turn was not kept
        os.write(term.fd, b"/bye\n")
        assert term.exit_code() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
            term.process.wait()


def test_ctrl_d_leaves(echo_server: Server, tmp_path: Path) -> None:
    term = Terminal(airgate_cmd("run", "echo"), client_env(echo_server, tmp_path / "home"))
    term.expect(">>> ")
    os.write(term.fd, b"\x04")
    assert term.exit_code() == 0


def one_shot(
    env: Mapping[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        airgate_cmd("run", *args),
        input=stdin,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=EXIT_DEADLINE_S,
    )


def test_one_shot_from_an_argument_and_from_stdin(echo_server: Server, tmp_path: Path) -> None:
    env = client_env(echo_server, tmp_path / "home")
    argued = one_shot(env, "echo", "Why", "is", "the", "sky", "blue?")
    assert argued.returncode == 0, argued.stderr
    assert argued.stdout.startswith(ANSWER) and argued.stdout.endswith("\n")
    piped = one_shot(env, "echo", stdin="Why is the sky blue?\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == argued.stdout  # the same length of prompt: the same answer
    nothing = one_shot(env, "echo")
    assert nothing.returncode == 2 and "no prompt" in nothing.stderr
    assert list((tmp_path / "home").rglob("*")) == []


def test_failures_are_one_line(echo_server: Server, tmp_path: Path) -> None:
    env = client_env(echo_server, tmp_path / "home")
    unknown = one_shot(env, "no-such-model", "hi")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert len(unknown.stderr.splitlines()) == 1 and "does not exist" in unknown.stderr
    keyless = one_shot({**env, "AIRGATE_API_KEY": ""}, "echo", "hi")
    assert keyless.returncode == 1 and "AIRGATE_API_KEY" in keyless.stderr
    elsewhere = one_shot({**env, "AIRGATE_HOST": f"http://127.0.0.1:{free_port()}"}, "echo", "hi")
    assert elsewhere.returncode == 1
    assert "airgate serve" in " ".join(elsewhere.stderr.split())


def test_ls_and_ps_list_the_model(echo_server: Server, tmp_path: Path) -> None:
    env = client_env(echo_server, tmp_path / "home")
    listed = run_cli(airgate_cmd("ls"), env)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert [r.split()[0] for r in rows] == ["echo", "long"]
    running = run_cli(airgate_cmd("ps", "--host", echo_server.base_url), env)
    assert running.returncode == 0, running.stderr
    header, *rows = running.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"]
    assert [r.split()[0] for r in rows] == ["echo", "long"]
    assert all(r.split()[-1] == "Forever" for r in rows)


def test_a_prompt_sent_with_run_is_never_kept(echo_server: Server, tmp_path: Path) -> None:
    """Zero retention through `run`: a canary typed in the chat and one given as an argument
    reach neither the server's log nor any file in its data directory."""
    env = client_env(echo_server, tmp_path / "home")
    typed, argued = (f"canary-{uuid.uuid4().hex}" for _ in range(2))
    term = Terminal(airgate_cmd("run", "echo"), env)
    term.expect(">>> ")
    assert ANSWER in term.say(f"remember {typed}")
    os.write(term.fd, b"/bye\n")
    assert term.exit_code() == 0
    assert one_shot(env, "echo", f"remember {argued}").returncode == 0
    # both requests are finished (their answers were whole): their log lines are written
    sinks = [echo_server.log_path, *(p for p in echo_server.data_dir.rglob("*") if p.is_file())]
    for path in sinks:
        data = path.read_bytes()
        for canary in (typed, argued):
            assert canary.encode() not in data, f"a prompt was kept in {path.name}"
    assert list((tmp_path / "home").rglob("*")) == []


def test_with_no_server_run_loads_the_models_itself(tmp_path: Path) -> None:
    """No server at the configuration's address: `run` serves the configuration in its own
    process for the chat (no key: the local user, trusted as `[auth] local_trust` trusts) and
    every turn is audited as that user; the data directory stays locked meanwhile."""
    port = free_port()
    (tmp_path / "policy.toml").write_text(POLICY)
    config = tmp_path / "airgate.toml"
    config.write_text(
        f"[server]\nport = {port}\n\n" + CONFIG.format(policy=tmp_path / "policy.toml")
    )
    data_dir = tmp_path / "data"
    canary = f"canary-{uuid.uuid4().hex}"
    env = {
        "AIRGATE_CONFIG": str(config),
        "AIRGATE_DATA_DIR": str(data_dir),
        "HOME": str(tmp_path / "home"),
        "TERM": "dumb",
    }
    term = Terminal(airgate_cmd("run", "echo"), env)
    try:
        shown = term.expect(">>> ")
        assert f"no server at http://127.0.0.1:{port}" in shown
        term.say("/set parameter num_predict 4")
        assert f"{SHORT}\n" in term.say("hello")
        assert f"{SHORT}\n" in term.say(f"again {canary}")
        # the data directory is this process's while it serves: a `serve` on it is refused
        busy = run_cli(airgate_cmd("serve", "--port", str(free_port())), env)
        assert busy.returncode == 2 and "in use by another airgate process" in busy.stderr
        os.write(term.fd, b"/bye\n")
        assert term.exit_code() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
            term.process.wait()
    with contextlib.closing(sqlite3.connect(data_dir / "airgate.db")) as conn:
        bodies = [json.loads(b) for (b,) in conn.execute("SELECT body FROM audit_events")]
        (last,) = conn.execute("SELECT kind FROM audit_checkpoints ORDER BY id DESC LIMIT 1")
    done = [b for b in bodies if b["kind"] == "inference.completed"]
    assert len(done) == 2
    assert {b["principal"]["key_id"] for b in done} == {f"local:{getpass.getuser()}"}
    assert {b["principal"]["method"] for b in done} == {"local"}
    assert last == ("close",)  # the server stopped cleanly: its log ends signed and closed
    # zero retention: the canary typed in the chat is in no file the server or `run` wrote
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert canary.encode() not in path.read_bytes(), path
