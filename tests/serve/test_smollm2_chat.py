"""SmolLM2-135M-Instruct (imported from its GGUF file) answers through its own chat template:
the prompt ids equal `transformers`' apply_chat_template on the same GGUF's tokenizer, the loss
mask covers exactly the answers, the end of a turn is <|im_end|>, and `sheepop chat` and the
`openai` client's chat completion against `sheepop serve` both know the capital of France."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from openai import OpenAI
from serve_helpers import ServerProcess

from sheepop.cli.chat import escape
from sheepop.tokenizers.chat_format import chat_ids, turn_end

pytestmark = pytest.mark.real_model

QUESTION = "What is the capital of France?"
SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
          "Face<|im_end|>\n")


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf_path.parent,
                                                      gguf_file=smollm2_gguf_path.name)


@pytest.fixture(scope="module")
def tokenizer(smollm2_run):
    from sheepop.checkpoint import format as checkpoint
    from sheepop.tokenizers import loads
    return loads(checkpoint.load_tokenizer_json(smollm2_run), "SmolLM2's tokenizer")


def test_the_prompt_ids_are_apply_chat_templates(tokenizer, hf_tokenizer, smollm2_gguf_path):
    import gguf
    meta = gguf.GGUFReader(smollm2_gguf_path).fields["tokenizer.chat_template"].contents()
    assert tokenizer.chat_template == meta == hf_tokenizer.chat_template
    conversations = [
        [{"role": "user", "content": QUESTION}],
        [{"role": "system", "content": "Answer in one word."},
         {"role": "user", "content": QUESTION},
         {"role": "assistant", "content": "Paris. Naïve café, 😀 漢字\n  indented"},
         {"role": "user", "content": "And of Spain?\t"}]]
    for messages in conversations:
        for prompt in (False, True):
            ids, _ = chat_ids(tokenizer, messages, prompt)
            assert ids == list(hf_tokenizer.apply_chat_template(
                messages, add_generation_prompt=prompt, tokenize=True, return_dict=False))
    ids, own = chat_ids(tokenizer, conversations[1])
    assert tokenizer.decode([i for i, mine in zip(ids, own) if mine]) == \
        "Paris. Naïve café, 😀 漢字\n  indented<|im_end|>\n"
    end = turn_end(tokenizer)
    assert end.ids == {hf_tokenizer.convert_tokens_to_ids("<|im_end|>")} == \
        {hf_tokenizer.eos_token_id}


def test_sheepop_chat_answers_through_the_template(smollm2_run):
    proc = subprocess.run([sys.executable, "-m", "sheepop", "chat", str(smollm2_run),
                           "--temperature", "0", "--max-new-tokens", "24", "--engine", "torch",
                           "--threads", "1", "--show-prompt"],
                          input=QUESTION + "\n", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    answer = proc.stdout.strip()
    assert "Paris" in answer and "<|im_end|>" not in answer, answer
    shown = [line.split(": ", 2)[2] for line in proc.stderr.splitlines()
             if line.startswith("sheepop: prompt (")]
    assert shown == [escape(SYSTEM + f"<|im_start|>user\n{QUESTION}<|im_end|>\n"
                                      "<|im_start|>assistant\n")]


def test_the_openai_clients_chat_completion_knows_the_capital_of_france(smollm2_run, tokenizer,
                                                                        hf_tokenizer):
    server = ServerProcess(smollm2_run, "--engine", "torch")
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                        timeout=600)
        messages = [{"role": "user", "content": QUESTION}]
        r = client.chat.completions.create(model=served_model(client), messages=messages,
                                           max_tokens=24, temperature=0)
        answer = r.choices[0].message.content
        assert "Paris" in answer and "<|im_end|>" not in answer, answer
        # (SmolLM2-135M goes on about Paris past 48 tokens: the end of a turn at <|im_end|> is
        # tested on a small model, tests/serve/test_model_template_serve.py)
        assert r.usage.prompt_tokens == len(hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        assert r.usage.prompt_tokens == len(chat_ids(tokenizer, messages, True)[0])
    finally:
        assert server.stop(signal.SIGTERM) == 0


def served_model(client: OpenAI) -> str:
    """The one model the server serves."""
    return client.models.list().data[0].id
