"""External datasets (``data=jsonl``, ``data=hf``): their rows' format, the column names, chat rendering, and the
row checks. A leaf module: nothing from rlhf_lab, no torch. Where the rows come from (a JSON-lines file line by line,
a ``datasets`` dataset), within bounds and each named ``file:line`` or ``name[split] row i``, is
:mod:`rlhf_lab.data.files`.

Formats (``data.format``: ``auto`` detects it from the first row that has the chosen column, or the
prompt column for a prompt-only dataset), as in TRL:

- ``standard``: ``prompt``, ``chosen``, ``rejected`` are strings. Without a prompt column
  (``data.columns.prompt=null``, HH-RLHF style) the prompt is the common beginning of chosen and rejected
  up to its last ``Assistant:``, the responses the rest.
- ``conversational``: each is a list of ``{"role", "content"}`` messages. The prompt is the prompt column's
  messages (a string there is one user message), or, without one, the messages chosen and rejected begin
  with in common (TRL's implicit prompt); chosen and rejected lose that prefix when they start with it
  (UltraFeedback style: full conversations beside a prompt). The prompt is rendered with the chat template
  and its generation prompt; a response is the text the template renders after the rendered prompt, its
  trailing EOS text and white space removed (the encoding adds EOS itself).

``data.columns`` maps the dataset's column names to ``prompt``, ``chosen``, ``rejected``. A prompt-only
dataset (for ``ppo``, ``grpo``, ``rloo``) needs only the prompt. Every row is checked (:func:`row_error`,
:func:`convert`): a bad row fails the job with its place, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from rlhf_lab.config.choices import DataFormat

FIELDS = ("prompt", "chosen", "rejected")
DEFAULT_COLUMNS = {f: f for f in FIELDS}
ASSISTANT_MARKER = "Assistant:"
MAX_LISTED_ERRORS = 10
# used when the policy's tokenizer has no chat template and data.chat_template is null
DEFAULT_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")


@dataclass(frozen=True)
class Example:
    """One checked row as text: the rendered prompt, and the responses (None in a prompt-only row)."""

    prompt: str
    chosen: str | None = None
    rejected: str | None = None


class BadRow(Exception):
    """A row that cannot be read or converted; the message says what is wrong."""


# ------------------------------------------------------------------------------------------------
# formats and checks


def columns_of(dc) -> dict[str, str | None]:
    """``data.columns`` with defaults: the dataset's column for each of prompt, chosen, rejected."""
    cols = dict(DEFAULT_COLUMNS)
    given = dc.get("columns") if dc is not None else None
    if given:
        cols.update({k: (None if v is None else str(v)) for k, v in dict(given).items()})
    unknown = sorted(set(cols) - set(FIELDS))
    if unknown:
        raise ValueError(f"data.columns: unknown field(s) {unknown}; map prompt, chosen, rejected")
    return cols


def messages_error(v: Any, field: str) -> str | None:
    """What is wrong with a list of chat messages (None: fine)."""
    if not isinstance(v, list):
        return f"{field} is {type(v).__name__}, not a list of messages"
    if not v:
        return f"{field} is an empty list of messages"
    for j, m in enumerate(v):
        if not isinstance(m, dict):
            return f"{field}[{j}] is {type(m).__name__}, not a {{role, content}} message"
        for k in ("role", "content"):
            if not isinstance(m.get(k), str):
                return f"{field}[{j}].{k} is {'missing' if m.get(k) is None else type(m.get(k)).__name__}, not a string"
    return None


def detect_format(row: Any, columns: dict[str, str | None]) -> str | None:
    """``conversational`` when the row's chosen (else prompt) value is a list, ``standard`` for a string."""
    if not isinstance(row, dict):
        return None
    for f in ("chosen", "prompt"):
        col = columns.get(f)
        if col and col in row and row[col] is not None:
            return "conversational" if isinstance(row[col], list) else "standard"
    return None


def needed(columns: dict[str, str | None], prompt_only: bool) -> list[str]:
    """The fields a row must have: the prompt (or, without a prompt column, chosen and rejected to derive it),
    and chosen and rejected unless the dataset is prompt-only."""
    if prompt_only:
        return ["prompt"] if columns["prompt"] else ["chosen", "rejected"]
    return [f for f in FIELDS if columns[f]]


def row_error(row: Any, columns: dict[str, str | None] | None = None, fmt: str = "standard",
              prompt_only: bool = False) -> str | None:
    """What is wrong with one decoded row before conversion (None: a good row): not an object, a needed
    column missing, null, of the wrong type for the format, or empty; chosen == rejected."""
    columns = columns or DEFAULT_COLUMNS
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    fields = needed(columns, prompt_only)
    missing = [columns[f] for f in fields if columns[f] not in row]
    if missing:
        return f"lacks column(s) {missing}; it has {sorted(row)}"
    for f in fields:
        v = row[columns[f]]
        if v is None:
            return f"{f} is null"
        if fmt == "conversational" and not (f == "prompt" and isinstance(v, str)):
            problem = messages_error(v, f)
            if problem:
                return problem
            if not any(m["content"].strip() for m in v):
                return f"{f} is empty (no message has content)"
        elif not isinstance(v, str):
            return f"{f} is {type(v).__name__}, not a string" + (" (data.format=standard)" if isinstance(v, list) else "")
        elif not v.strip():
            return f"{f} is empty"
    if not prompt_only and row[columns["chosen"]] == row[columns["rejected"]]:
        return "chosen == rejected (the row carries no preference)"
    return None


# ------------------------------------------------------------------------------------------------
# conversion to text


class ChatRenderer:
    """Renders messages with a Jinja chat template as Hugging Face tokenizers do (``messages``,
    ``add_generation_prompt``, ``bos_token``, ``eos_token``). ``strip_bos``: drop a leading BOS text, for a
    tokenizer that adds BOS itself when it encodes the prompt (no double BOS)."""

    def __init__(self, template: str | None = None, bos_token: str | None = None, eos_token: str | None = None,
                 strip_bos: bool = False):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise BadRow(f"the chat template refused the messages: {msg}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        self.template_text = template or DEFAULT_CHAT_TEMPLATE
        self.template = env.from_string(self.template_text)
        self.bos, self.eos, self.strip_bos = bos_token or "", eos_token or "", bool(strip_bos)

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text for `messages`; a template that fails on them raises :class:`BadRow` (the row is
        named by the caller), not the template engine's error."""
        from jinja2 import TemplateError

        try:
            text = self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos, eos_token=self.eos)
        except (TemplateError, TypeError, ValueError) as err:
            raise BadRow(f"the chat template fails on these messages ({type(err).__name__}: {err}); fix the row or "
                         "data.chat_template") from err
        if self.strip_bos and self.bos and text.startswith(self.bos):
            text = text[len(self.bos):]
        return text

    def prompt(self, messages: list[dict]) -> str:
        return self.render(messages, add_generation_prompt=True)

    def response(self, prompt_messages: list[dict], response_messages: list[dict], field: str) -> str:
        """The text rendered after the rendered prompt, its trailing EOS text and white space removed."""
        head = self.prompt(prompt_messages)
        full = self.render(prompt_messages + response_messages, add_generation_prompt=False)
        if not full.startswith(head):
            raise BadRow(f"{field}: the chat template does not render the prompt (with its generation prompt) as "
                         "the beginning of the conversation, so the response cannot be cut after it; set "
                         "data.chat_template to a template that does")
        text = full[len(head):].rstrip()
        if self.eos and text.endswith(self.eos):
            text = text[: -len(self.eos)].rstrip()
        return text.strip()


def common_prefix(a: list | str, b: list | str) -> list | str:
    """The longest beginning `a` and `b` share (messages, or characters)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def split_standard(chosen: str, rejected: str) -> tuple[str, str, str]:
    """HH-RLHF style: (prompt, chosen, rejected) from two full dialogues; the prompt ends at the last
    ``Assistant:`` of their common beginning."""
    cut = common_prefix(chosen, rejected).rfind(ASSISTANT_MARKER)
    if cut < 0:
        raise BadRow(f"no prompt column, and chosen and rejected share no beginning ending in {ASSISTANT_MARKER!r}; "
                     "set data.columns.prompt to the prompt column")
    cut += len(ASSISTANT_MARKER)
    return chosen[:cut].strip(), chosen[cut:].strip(), rejected[cut:].strip()


def convert(row: dict, columns: dict[str, str | None], fmt: str, renderer: ChatRenderer | None,
            prompt_only: bool = False) -> Example:
    """A checked row (:func:`row_error` passed) as text; raises :class:`BadRow` when it cannot be."""
    get = lambda f: row.get(columns[f]) if columns[f] else None  # noqa: E731
    chosen, rejected = get("chosen"), get("rejected")
    has_pair = chosen is not None and rejected is not None and not prompt_only
    if fmt == "standard":
        if columns["prompt"]:
            ex = Example(get("prompt"), chosen if has_pair else None, rejected if has_pair else None)
        else:
            p, c, r = split_standard(chosen, rejected)
            ex = Example(p, c if has_pair else None, r if has_pair else None)
    else:
        if renderer is None:
            raise BadRow("conversational rows need a chat template renderer")
        prompt = get("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if prompt is None:
            prompt = common_prefix(chosen, rejected)
            if not prompt:
                raise BadRow("no prompt column, and chosen and rejected begin with no common message; set "
                             "data.columns.prompt to the prompt column")
        if not has_pair:
            return Example(renderer.prompt(prompt))
        strip = lambda msgs: msgs[len(prompt):] if msgs[: len(prompt)] == prompt else msgs  # noqa: E731
        c, r = strip(chosen), strip(rejected)
        for field, msgs in (("chosen", c), ("rejected", r)):
            if not msgs:
                raise BadRow(f"{field} has no message after the prompt")
        ex = Example(renderer.prompt(prompt), renderer.response(prompt, c, "chosen"),
                     renderer.response(prompt, r, "rejected"))
    for field in ("chosen", "rejected") if has_pair else ():
        if not getattr(ex, field).strip():
            raise BadRow(f"{field} is empty after the prompt")
    if has_pair and ex.chosen == ex.rejected:
        raise BadRow("chosen == rejected after rendering (the row carries no preference)")
    if not ex.prompt.strip():
        raise BadRow("prompt is empty")
    return ex


def read_examples(rows: Iterator[tuple[str, Any]], columns: dict[str, str | None], fmt: str = "auto",
                  renderer_fn=None, prompt_only: bool = False, key: str = "data") -> list[Example]:
    """Every row checked and converted; any bad row raises one ValueError that counts them and lists
    ``where: what`` for the first :data:`MAX_LISTED_ERRORS`. ``renderer_fn()`` gives the chat renderer,
    called once, only for conversational data."""
    if fmt not in tuple(DataFormat):
        raise ValueError(f"data.format={fmt!r}; choose one of {', '.join(DataFormat)}")
    examples, errors, n_rows, renderer = [], [], 0, None
    for where, row in rows:
        n_rows += 1
        if isinstance(row, BadRow):
            errors.append(f"{where}: {row}")
            continue
        if fmt == "auto":
            fmt = detect_format(row, columns) or "auto"
        problem = row_error(row, columns, "standard" if fmt == "auto" else fmt, prompt_only)
        if problem:
            errors.append(f"{where}: {problem}")
            continue
        try:
            if fmt == "conversational" and renderer is None:
                renderer = renderer_fn() if renderer_fn else ChatRenderer()
            examples.append(convert(row, columns, fmt, renderer, prompt_only))
        except BadRow as err:
            errors.append(f"{where}: {err}")
    if errors:
        shown = "\n  ".join(errors[:MAX_LISTED_ERRORS])
        more = f"\n  ... and {len(errors) - MAX_LISTED_ERRORS} more" if len(errors) > MAX_LISTED_ERRORS else ""
        raise ValueError(f"{key}: {len(errors)} bad row(s) of {n_rows}; fix or remove them:\n  {shown}{more}")
    if not examples:
        raise ValueError(f"{key}: the {'prompt' if prompt_only else 'preference'} dataset is empty; nothing to train on")
    return examples
