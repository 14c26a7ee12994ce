"""Each exception: its class, and a message that names the problem and the fix."""

import os
import socket
import threading

import pytest

from airlock import ArtifactError, PolicyError, Sandbox, SandboxError, SandboxUnavailable


def test_the_hierarchy():
    assert issubclass(PolicyError, SandboxError) and issubclass(PolicyError, ValueError)
    assert issubclass(ArtifactError, SandboxError)
    assert issubclass(SandboxUnavailable, SandboxError)
    assert issubclass(SandboxError, Exception)


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"mem_mb": 8}, ["mem_mb", "at least 16", "not 8"]),
        ({"mem_mb": 1 << 40}, ["mem_mb", "above what this host has"]),
        ({"mem_mb": "lots"}, ["mem_mb", "must be integer"]),
        ({"mem_mb": -1}, ["mem_mb", "-1"]),
        ({"pids": 0}, ["pids", "at least 1", "not 0"]),
        ({"timeout_s": 0}, ["timeout_s", "at least 0.001"]),
        ({"timeout_s": float("inf")}, ["timeout_s=inf"]),
        ({"timeout_s": 10**9}, ["timeout_s", "at most 86400"]),
        ({"cpus": 1000}, ["cpus", "the host's"]),
        ({"on_output_limit": "explode"}, ["on_output_limit", "truncate", "kill"]),
        ({"env": {"1BAD": "x"}}, ["env.1BAD", "not a variable name"]),
        ({"env": {"A": 1}}, ["env.A", "must be string"]),
        ({"env": "A=1"}, ["env takes a dict of strings"]),
        ({"env": {"A": "x\0y"}}, ["NUL"]),
        ({"network": True}, ["network=True", "network=['api.example.com']"]),
        ({"network": "api.example.com"}, ["network=['api.example.com']"]),
        ({"network": ["https://api.example.com/v1"]}, ["network entry", "a URL is not a host"]),
        ({"network": ["*"]}, ["network entry", "wildcard"]),
        ({"network": [443]}, ["network", "443"]),
        ({"allow_degraded": ["seccomp"]}, ["allow_degraded", "cgroups", "landlock", "not \"seccomp\""]),
        ({"allow_degraded": ["bogus"]}, ["allow_degraded", "not \"bogus\""]),
        ({"max_files_total_bytes": 0}, ["max_files_total_bytes", "at least 1"]),
        ({"image": "no-such-image"}, ['no image called "no-such-image"', "airlock image build"]),
        ({"image": "../etc"}, ["not a valid image name"]),
        ({"image": 3}, ["image must be the name of an image"]),
    ],
)
def test_a_bad_setting_is_a_policy_error_that_names_it(settings, words):
    with pytest.raises(PolicyError) as caught:
        Sandbox(**settings)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_an_unknown_setting_is_a_type_error():
    with pytest.raises(TypeError, match="memroy_mb"):
        Sandbox(memroy_mb=512)


def test_bad_run_arguments_are_policy_errors(sandbox):
    with pytest.raises(PolicyError, match='lang="ruby"'):
        sandbox.run("1", lang="ruby")
    with pytest.raises(PolicyError, match='cwd="/tmp"'):
        sandbox.run("1", cwd="/tmp")
    with pytest.raises(PolicyError, match=r"'\.\.'"):
        sandbox.run("1", cwd="/work/../etc")


def test_paths_outside_work_are_policy_errors(sandbox):
    for path in ["/etc/passwd", "../x", "/work/../etc/passwd", "/work", ""]:
        with pytest.raises(PolicyError):
            sandbox.read(path)
        with pytest.raises(PolicyError):
            sandbox.write(path, b"x")


def test_write_refuses_other_types(sandbox):
    with pytest.raises(TypeError, match="bytes or str"):
        sandbox.write("x", 5)


def test_a_missing_artefact(sandbox):
    with pytest.raises(ArtifactError, match=r"/work/out\.json does not exist"):
        sandbox.read("/work/out.json")


def test_an_oversized_artefact():
    with Sandbox(max_file_bytes=1000) as sb:
        assert sb.run("open('big', 'wb').write(b'x' * 2000)").ok
        with pytest.raises(ArtifactError, match="2000 bytes, above the cap of 1000; raise max_file_bytes"):
            sb.read("big")
        assert sb.run("open('small', 'wb').write(b'x' * 100)").ok
        with pytest.raises(ArtifactError, match="above the cap of 10"):
            sb.read("small", max_bytes=10)
        assert sb.read("small") == b"x" * 100


@pytest.mark.parametrize(
    "make, words",
    [
        ("os.mkdir('it')", "is a directory, not a regular file"),
        ("os.mkfifo('it')", "is a FIFO, not a regular file"),
        ("os.symlink('/etc/passwd', 'it')", "symbolic link, which is never followed"),
        ("os.mkdir('real'); open('real/x', 'w').write('x'); os.symlink('real', 'it')", "symbolic link"),
    ],
)
def test_a_non_regular_artefact(sandbox, make, words):
    assert sandbox.run(f"import os\n{make}").ok
    path = "/work/it/x" if "real/x" in make else "/work/it"
    with pytest.raises(ArtifactError, match=words):
        sandbox.read(path)


def test_a_file_too_large_to_copy_in():
    with Sandbox(max_file_bytes=1000, max_files_total_bytes=1500) as sb:
        with pytest.raises(ArtifactError, match="above max_file_bytes"):
            sb.write("a", b"x" * 1001)
        sb.write("a", b"x" * 1000)
        with pytest.raises(ArtifactError, match="max_files_total_bytes"):
            sb.write("b", b"x" * 1000)


def test_copying_in_never_follows_a_planted_link(sandbox, tmp_path):
    target = tmp_path / "outside"
    target.mkdir()
    assert sandbox.run(f"import os\nos.symlink({str(target)!r}, 'link')").ok
    with pytest.raises(ArtifactError):
        sandbox.write("link/planted.txt", b"escaped?")
    assert os.listdir(target) == []


def test_network_reaches_only_the_allowed_host():
    """Two real servers on loopback; only the one allowed is reached, through
    the proxy, and the record lists both attempts."""
    allowed, other = _Server(), _Server()
    try:
        code = (
            "import urllib.request\n"
            "def fetch(port):\n"
            "    try:\n"
            "        return urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=5).read().decode()\n"
            "    except Exception as e:\n"
            "        return type(e).__name__\n"
            f"(fetch({allowed.port}), fetch({other.port}))"
        )
        with Sandbox(network=[f"127.0.0.1:{allowed.port}"]) as sb:
            out = sb.run(code)
        assert out.ok, out.stderr
        assert out.value == "('hello from the allowed host', 'HTTPError')"
        assert (allowed.hits, other.hits) == (1, 0)
        network = out.record["network"]
        assert network["allowed_hosts"] == [f"127.0.0.1:{allowed.port}"]
        verdicts = [(c["port"], c["verdict"]) for c in network["connections"]]
        assert verdicts == [(allowed.port, "allowed"), (other.port, "denied")]
    finally:
        allowed.stop()
        other.stop()


def test_without_network_nothing_is_reachable(sandbox):
    server = _Server()
    try:
        out = sandbox.run(
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {server.port}), timeout=3)\n"
            "    'connected'\n"
            "except OSError as e:\n"
            "    type(e).__name__"
        )
        assert out.ok and out.value != "'connected'"
        assert server.hits == 0
    finally:
        server.stop()


def test_a_sandbox_error_carries_the_run_record(sandbox):
    with pytest.raises(SandboxError) as caught:
        sandbox.run("1", cwd="/work/no/such/folder")
    assert "/work/no/such/folder" in str(caught.value)
    result = caught.value.result
    assert result.status == "sandbox_error" and not result.ok
    assert result.code == "1"
    assert result.message == str(caught.value)


class _Server:
    """A real HTTP server on loopback that counts its connections."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.hits = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.hits += 1
            with conn:
                conn.recv(65536)
                body = b"hello from the allowed host"
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def stop(self):
        # shutdown wakes the blocked accept; close alone would not.
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5)
