"""A password that the admin chose for a user of the team server (``rlhf-lab-server user add --password-file``): read
from a file only its owner reads and writes (another user could have read the password, or set it), and refused when
it is shorter than :data:`MIN_LENGTH` or one of the passwords every guesser tries first (:func:`weakness`). The list is
short and built in, not a breached-password database: a generated password (``user add``'s default) is the safe
choice. Every refusal is a :class:`rlhf_lab.server.files.Refused` (one line, exit status 2).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from rlhf_lab.server.files import Refused, ServerError, user_name

MIN_LENGTH = 12
# words at the top of published lists of leaked passwords (with digits around them: password1234, qwerty123), and the
# names a guesser tries first against this server
COMMON_WORDS = frozenset("""
password passw0rd pass qwerty qwertyuiop qwertz azerty asdf asdfgh asdfghjkl zxcvbn zxcvbnm 1q2w3e4r 1qaz2wsx qazwsx
abc abcd abcdef abcdefgh abcdefghijkl letmein welcome admin administrator root toor user guest login master changeme
secret default iloveyou monkey dragon football baseball soccer hockey sunshine princess shadow superman batman
trustno1 starwars whatever freedom hello hellohello michael jennifer charlie jordan computer internet test testing
mlflow rlhf rlhflab rlhf-lab postgres postgresql database server
""".split())
EDGES = re.compile(r"^[\W\d_]+|[\W\d_]+$")  # digits and punctuation around a word


def read_password_file(path: Path) -> str:
    """The password in ``path`` (its first line, without the line break); a Refused if the file is another user's
    or others may read or write it; a ServerError if it is empty, padded or unreadable."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except OSError as err:
        raise ServerError(f"cannot read the password file {path}: {err.strerror}") from None
    me = os.geteuid()
    if st.st_uid != me:
        raise Refused(f"the password file {path} belongs to {user_name(st.st_uid)}, not to {user_name(me)} who runs "
                      f"rlhf-lab-server: write the password into a file of your own, mode 600")
    if st.st_mode & 0o066:
        raise Refused(f"the password file {path} can be read or written by other users (mode "
                      f"{oct(stat.S_IMODE(st.st_mode))}): chmod 600 {path}, and choose another password if they may "
                      f"have read it")
    lines = data.decode(errors="replace").splitlines()
    if not lines or not lines[0].strip() or lines[0] != lines[0].strip():
        raise ServerError(f"the password file {path} must hold the password on its first line, without spaces "
                          f"around it")
    return lines[0]


def weakness(password: str, name: str = "") -> str | None:
    """Why ``password`` (of the user ``name``) is too easy to guess, or None: short, a word of :data:`COMMON_WORDS` or
    the user's name with digits and punctuation around it or not (``password1234``, ``!admin2024``), or nothing but
    digits and punctuation."""
    if len(password) < MIN_LENGTH:
        return f"it has {len(password)} characters, fewer than {MIN_LENGTH}"
    lowered = password.lower()
    stem = EDGES.sub("", lowered)
    around = " with digits or punctuation around it" if stem != lowered else ""
    if not stem:
        return "it is only digits and punctuation"
    if lowered in COMMON_WORDS or stem in COMMON_WORDS:
        return f"it is a common password{around}"
    if name and stem == name.lower():
        return f"it is the user's name{around}"
    return None


def check_password(password: str, name: str, source: Path) -> None:
    """A Refused naming ``source`` when ``password`` is too easy to guess (:func:`weakness`)."""
    why = weakness(password, name)
    if why:
        raise Refused(f"the password in {source} is too easy to guess ({why}): choose a longer, uncommon one, or leave "
                      f"out --password-file to have one generated")
