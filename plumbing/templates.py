"""plumbing/templates.py: one rule for rendering a chat under any model's template (skip on first reading).

Every prompt mascot writes is a list of chat messages (system, user, assistant), rendered by the
model's own chat template, which is what the model was tuned on. Templates differ in ways that would
otherwise break a prompt or silently change it, so every caller (the sampler's models.chat_prompt_ids,
the reward model, the warm starts, the LLM judge, the evaluators) renders through `render_chat`, which
applies one rule:
  - thinking off: a template with a thinking mode (Qwen3's `enable_thinking`) would spend the reply's
    token budget thinking; the generation prompt then ends with its empty think block;
  - no system role (Gemma 2): the system message is folded into the first user turn;
  - strict alternation (Gemma 2 and 3): neighbouring messages of one role are joined, and a history
    that opens with the assistant's own turn loses that turn (as if the window slid one turn on);
  - a template that still cannot render such a chat is one line naming the model.
tests/test_families.py checks it on Qwen3, Llama 3, Gemma 2, Gemma 3 and Phi-3.
"""

from dataclasses import dataclass

from plumbing.common import UserError


@dataclass(frozen=True)
class TemplateStyle:
    """What a tokenizer's chat template accepts, found once by rendering tiny probe chats."""

    thinking: bool  # it has a thinking switch (enable_thinking), turned off here
    system: bool  # it renders a system message
    alternation: bool  # it refuses two neighbouring messages of one role


_STYLES: dict[tuple, TemplateStyle] = {}  # (tokenizer name, template) -> its style


def template_style(tok) -> TemplateStyle:
    """The tokenizer's TemplateStyle (cached); a UserError when it has no usable chat template."""
    template = tok.chat_template if isinstance(tok.chat_template, str) else str(tok.chat_template)
    key = (tok.name_or_path, template)
    if key not in _STYLES:
        if not tok.chat_template:
            raise UserError(
                f"{tok.name_or_path}: the tokenizer has no chat template; mascot prompts every role "
                "as a chat, so use an instruction-tuned model (or give the tokenizer a chat_template)"
            )
        thinking = "enable_thinking" in template
        system_probe = [{"role": "system", "content": "S-probe"}, {"role": "user", "content": "U"}]
        user_probe = [{"role": "user", "content": "A"}, {"role": "user", "content": "B"}]
        system = "S-probe" in (try_render(tok, system_probe, thinking) or "")
        alternation = try_render(tok, user_probe, thinking) is None
        _STYLES[key] = TemplateStyle(thinking, system, alternation)
    return _STYLES[key]


def try_render(tok, messages: list[dict], thinking: bool) -> str | None:
    """The template's text for `messages`, or None where the template raises (its way to refuse)."""
    extra = {"enable_thinking": False} if thinking else {}
    try:
        return tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra
        )
    except Exception:  # jinja2's TemplateError from raise_exception(), and template bugs alike
        return None


def fit_to_template(messages: list[dict], style: TemplateStyle) -> list[dict]:
    """The messages reshaped so the template takes them (the rule above); unchanged otherwise."""
    out = [dict(m) for m in messages]
    if style.alternation:
        out = alternating(out)
    if not style.system and out and out[0]["role"] == "system":
        system = out.pop(0)["content"]
        if out and out[0]["role"] == "user":
            out[0]["content"] = f"{system}\n\n{out[0]['content']}"
        else:
            out.insert(0, {"role": "user", "content": system})
    return out


def alternating(messages: list[dict]) -> list[dict]:
    """Neighbouring messages of one role joined, and the history opened by the user: an opening
    assistant turn (after the system message) gives way, as if the window had slid one turn on."""
    joined = []
    for m in messages:
        if joined and joined[-1]["role"] == m["role"]:
            joined[-1]["content"] += "\n\n" + m["content"]
        else:
            joined.append(m)
    first = 1 if joined and joined[0]["role"] == "system" else 0
    while len(joined) > first + 1 and joined[first]["role"] == "assistant":
        joined.pop(first)
    return joined


def render_chat(tok, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """`messages` as text by the tokenizer's own chat template, under the one rule above: ready for
    the assistant's reply (add_generation_prompt), or a finished chat (the reward model reads those)."""
    style = template_style(tok)
    extra = {"enable_thinking": False} if style.thinking else {}
    fitted = fit_to_template(messages, style)
    try:
        return tok.apply_chat_template(
            fitted, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
    except Exception as err:  # what the rule could not fix: one line, naming the model
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"{tok.name_or_path}: its chat template refuses mascot's chats ({first}); use a model "
            "whose template takes system, user and assistant messages"
        ) from None
