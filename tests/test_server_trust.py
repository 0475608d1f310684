"""The team server uses nothing another local user planted (issue 65, items 1 and 8): a team folder, a secret, a
symbolic link where it writes, a folder above that others could swap; it creates its folder 0700, its logs are 0600,
and `user add` refuses a password file others may read and a common password.

No server starts here: `rlhf-lab-server start` is stopped (`stop_before_postgres`) at the first step that touches
PostgreSQL's cluster, which a refused folder never reaches. Root (CI) plays the victim; `nobody` (uid 65534) owns what
another user would have planted."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from rlhf_lab.entry import server
from rlhf_lab.runs.process import write_atomic
from rlhf_lab.server import files as server_files, passwords

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another user (chown): needs root")


@pytest.fixture
def base():
    """A folder under /tmp (sticky, root's: trusted), mode 0755, removed after."""
    path = Path(tempfile.mkdtemp(prefix="rlhf_lab_trust_"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def stop_before_postgres(monkeypatch):
    """`start` fails at its first PostgreSQL step (secure_cluster: initdb) instead of starting a server: a start that
    was not refused ends there with exit status 1."""
    def reached(*args):
        raise server.ServerError("reached PostgreSQL")

    monkeypatch.setattr(server, "secure_cluster", reached)


def start(folder: Path, capsys) -> tuple[int, str]:
    rc = server.main(["start", "--dir", str(folder), "--port", str(server.free_port())])
    return rc, capsys.readouterr().err.strip()


def plant_secrets(folder: Path, owner: int = NOBODY) -> None:
    """What the red team did as another user: `mkdir -p T/secrets`, chosen secrets with mode 0600."""
    (folder / "secrets").mkdir(parents=True, mode=0o700)
    for name in ("mlflow_admin", "postgres_superuser"):
        (folder / "secrets" / name).write_text("chosen-by-the-attacker\n")
        (folder / "secrets" / name).chmod(0o600)
    for path in (folder, folder / "secrets", *(folder / "secrets").iterdir()):
        os.chown(path, owner, owner)


@needs_root
def test_a_team_folder_planted_by_another_user_is_refused(base, capsys, stop_before_postgres):
    team = base / "T"
    plant_secrets(team)
    team.chmod(0o755)
    rc, err = start(team, capsys)
    assert rc == 2 and err == (f"rlhf-lab-server: {team} belongs to nobody, not to root who runs rlhf-lab-server "
                               f"(another user may have planted it): use a folder of your own, e.g. ~/rlhf_team "
                               f"(rlhf-lab-server creates it, mode 0700)")
    assert sorted(p.name for p in team.iterdir()) == ["secrets"]  # nothing written into it
    for command in (["status", "--dir", str(team)], ["stop", "--dir", str(team)]):
        assert server.main(command) == 2 and "belongs to nobody" in capsys.readouterr().err


@needs_root
@pytest.mark.parametrize("planted", ["secrets/", "secrets/mlflow_admin", "secrets/basic_auth.db", "users/",
                                     "users/ann.credentials", "server.json", "mlflow.log", "artifacts/", "postgres/"])
def test_anything_in_the_folder_another_user_owns_is_refused(base, capsys, stop_before_postgres, planted):
    """The folder is root's, one thing in it another user's (as after a `chmod 777` that was undone)."""
    team = base / "T"
    team.mkdir(mode=0o700)
    for folder in ("secrets", "users"):
        (team / folder).mkdir(mode=0o700)
    path = team / planted.rstrip("/")
    if planted.endswith("/"):
        path.mkdir(mode=0o700, exist_ok=True)
    else:
        path.write_text("{}\n")
        path.chmod(0o600)
    os.chown(path, NOBODY, NOBODY)
    rc, err = start(team, capsys)
    assert rc == 2 and err.startswith(f"rlhf-lab-server: {path} belongs to nobody, not to root who runs ") and \
        err.endswith("remove it if you did not make it (or rlhf-lab-server start --dir a new folder, e.g. ~/rlhf_team)")
    if planted == "postgres/":  # the PostgreSQL user's data folder is its own
        account = server.pg_account()
        os.chown(path, account.pw_uid, account.pw_gid)
        assert start(team, capsys) == (1, "rlhf-lab-server: reached PostgreSQL")


@needs_root
def test_a_secret_file_of_another_user_in_ones_own_folder_is_not_read(base):
    """The issue's check read the file's mode (0600 passed), not its owner."""
    layout = server_files.Layout(base / "T")
    plant_secrets(layout.root, owner=0)
    os.chown(layout.admin_secret, NOBODY, NOBODY)
    with pytest.raises(server_files.Refused, match=f"^{layout.admin_secret} belongs to nobody, not to root .*; then "
                                                   f"change the secrets: others may know them$"):
        server_files.read_secret(layout.admin_secret)
    assert server_files.read_secret(layout.superuser_secret) == "chosen-by-the-attacker"  # root's own: read


def test_a_group_writable_secret_file_is_refused_before_anything_starts(base, capsys, stop_before_postgres):
    team = base / "T"
    plant_secrets(team, owner=os.geteuid())
    (team / "secrets" / "mlflow_admin").chmod(0o620)
    rc, err = start(team, capsys)
    assert rc == 2 and err == (f"rlhf-lab-server: {team / 'secrets' / 'mlflow_admin'} can be written by other users "
                               f"(mode 0o620): chmod go-w {team / 'secrets' / 'mlflow_admin'} if nobody else changed "
                               f"it, else remove it if you did not make it (or rlhf-lab-server start --dir a new "
                               f"folder, e.g. ~/rlhf_team)")


def test_a_symlinked_server_json_is_refused_and_its_target_left_alone(base, capsys, stop_before_postgres):
    """The red team's `ln -s <a root-owned 0600 file> T/server.json`: start overwrote the target with its JSON."""
    victim = base / "victim"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    team = base / "T"
    team.mkdir(mode=0o700)
    (team / "server.json").symlink_to(victim)
    rc, err = start(team, capsys)
    assert rc == 2 and err.startswith(f"rlhf-lab-server: {team / 'server.json'} is a symbolic link (rlhf-lab-server "
                                      f"follows none in its folder): remove it if you did not make it")
    assert victim.read_text() == "root's own\n"
    assert server.main(["status", "--dir", str(team)]) == 2  # nor are pids read from it (stop would kill them)
    # the files it writes replace a symbolic link, never follow it
    write_atomic(team / "server.json", "{}")
    assert not (team / "server.json").is_symlink() and victim.read_text() == "root's own\n"
    assert (team / "server.json").stat().st_mode & 0o777 == 0o600


def test_a_symlinked_folder_and_folders_above_that_others_could_swap_are_refused(base, capsys, stop_before_postgres):
    real = base / "real"
    real.mkdir(mode=0o700)
    (base / "link").symlink_to(real)
    rc, err = start(base / "link", capsys)
    assert rc == 2 and err == (f"rlhf-lab-server: {base / 'link'} is a symbolic link: give --dir the real folder "
                               f"({real}) if it is yours, else a folder of your own, e.g. ~/rlhf_team")
    base.chmod(0o777)  # anyone could rename T away and put theirs in its place
    rc, err = start(base / "T", capsys)
    assert rc == 2 and err == (f"rlhf-lab-server: {base}, above {base / 'T'}, can be written by other users (mode "
                               f"0o777), who could swap the folder: chmod go-w {base}, or put --dir in a folder of "
                               f"your own, e.g. ~/rlhf_team")
    assert not (base / "T").exists()
    base.chmod(0o1777)  # sticky, as /tmp: others cannot rename or remove what is not theirs
    assert start(base / "T", capsys) == (1, "rlhf-lab-server: reached PostgreSQL")


@needs_root
def test_a_folder_above_owned_by_another_user_is_refused(base, capsys, stop_before_postgres):
    os.chown(base, NOBODY, NOBODY)
    rc, err = start(base / "T", capsys)
    assert rc == 2 and err == (f"rlhf-lab-server: {base}, above {base / 'T'}, belongs to nobody, who could swap the "
                               f"folder: put --dir in a folder of your own, e.g. ~/rlhf_team")


def test_start_creates_its_folder_0700(base, capsys, stop_before_postgres):
    team = base / "new" / "team"
    assert start(team, capsys) == (1, "rlhf-lab-server: reached PostgreSQL")
    # as root the PostgreSQL user must pass through it to <dir>/postgres: o+x, no listing
    assert stat.S_IMODE(team.stat().st_mode) == (0o701 if os.geteuid() == 0 else 0o700)


def test_logs_are_opened_0600_and_never_through_a_symbolic_link(base):
    log = base / "mlflow.log"
    log.write_text("old lines\n")
    log.chmod(0o644)  # a log of the older server
    os.close(server_files.open_private_log(log))
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and log.read_text() == "old lines\n"
    (base / "pg.log").symlink_to(base / "victim")
    with pytest.raises(server_files.Refused, match="is a symbolic link"):
        server_files.open_private_log(base / "pg.log")
    assert not (base / "victim").exists()


def password_file(folder: Path, text: str, mode: int = 0o600) -> Path:
    path = folder / "pw"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_user_add_refuses_a_password_file_others_may_read_and_common_passwords(base, capsys):
    team = base / "T"
    pw = password_file(base, "Vq7-long-and-uncommon", 0o644)
    assert server.main(["user", "add", "ann", "--dir", str(team), "--password-file", str(pw)]) == 2
    assert capsys.readouterr().err.strip() == (f"rlhf-lab-server: the password file {pw} can be read or written by "
                                               f"other users (mode 0o644): chmod 600 {pw}, and choose another password "
                                               f"if they may have read it")
    for weak, why in (("password1234", "it is a common password with digits or punctuation around it"),
                      ("short", "it has 5 characters, fewer than 12"), ("2024-12-06!!!", "it is only digits and "
                                                                                       "punctuation"),
                      ("Ann_1234567890", "it is the user's name with digits or punctuation around it")):
        pw = password_file(base, weak)
        assert server.main(["user", "add", "ann", "--dir", str(team), "--password-file", str(pw)]) == 2
        assert capsys.readouterr().err.strip() == (f"rlhf-lab-server: the password in {pw} is too easy to guess "
                                                   f"({why}): choose a longer, uncommon one, or leave out "
                                                   f"--password-file to have one generated")
    assert passwords.weakness("correct horse battery staple") is None
    pw = password_file(base, "Vq7-long-and-uncommon")  # a good one passes on to the server check
    assert server.main(["user", "add", "ann", "--dir", str(team), "--password-file", str(pw)]) == 1
    assert "no server runs in" in capsys.readouterr().err
    if os.geteuid() == 0:
        os.chown(pw, NOBODY, NOBODY)
        with pytest.raises(server_files.Refused, match=f"the password file {pw} belongs to nobody, not to root"):
            passwords.read_password_file(pw)
