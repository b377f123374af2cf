"""Reference tokenizer output from the real llama.cpp (llama-cpp-python), for compute/tests/tokenizer.rs.

Usage: python tokenize_ref.py MODEL.gguf CORPUS.txt [ids-only]
CORPUS holds one JSON string per line. Prints one JSON object on stdout:
  tokenize: for each corpus string, [ids with add_bos=True, special=True, ids with add_bos=False, special=False]
  pieces / pieces_plain: hex bytes of every token's piece with special rendering on / off
  eog: ids llama.cpp treats as end of generation
  bos, eos, eot, add_bos, add_eos, n_vocab: the vocabulary's settings (-1 = none)
  chat: the chat template rendered by Python's jinja2 with Hugging Face's settings, for a few conversations
"""

import ctypes
import json
import sys

import llama_cpp


def main():
    model_path, corpus_path = sys.argv[1], sys.argv[2]
    with open(corpus_path, encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f.read().split("\n") if line]
    llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    out = {"tokenize": []}
    for text in corpus:
        b = text.encode("utf-8")
        out["tokenize"].append([llm.tokenize(b, add_bos=True, special=True), llm.tokenize(b, add_bos=False, special=False)])

    if len(sys.argv) > 3 and sys.argv[3] == "ids-only":
        json.dump(out, sys.stdout)
        return

    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(1024)

    def piece(tok, special):
        k = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
        if k < 0:
            raise RuntimeError(f"piece of {tok} needs {-k} bytes")
        return buf.raw[:k].hex()

    out["pieces"] = [piece(i, True) for i in range(n)]
    out["pieces_plain"] = [piece(i, False) for i in range(n)]
    out["eog"] = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    out["bos"] = llama_cpp.llama_vocab_bos(vocab)
    out["eos"] = llama_cpp.llama_vocab_eos(vocab)
    out["add_bos"] = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    out["add_eos"] = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
    out["eot"] = llama_cpp.llama_vocab_eot(vocab)
    out["n_vocab"] = n

    template = llm.metadata.get("tokenizer.chat_template")
    out["chat"] = []
    if template:
        import jinja2
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        tmpl = env.from_string(template)
        bos_text = llama_cpp.llama_vocab_get_text(vocab, out["bos"]).decode("utf-8")
        eos_text = llama_cpp.llama_vocab_get_text(vocab, out["eos"]).decode("utf-8")
        convs = [
            [["user", "Hello!"]],
            [["system", "Be brief."], ["user", "What is 2+2?"]],
            [["user", "hi"], ["assistant", "Hello! How can I help?"], ["user", "Tell me a joke\nwith two lines"]],
            [],
        ]
        for conv in convs:
            for gen in (True, False):
                msgs = [{"role": r, "content": c} for r, c in conv]
                text = tmpl.render(messages=msgs, add_generation_prompt=gen, bos_token=bos_text, eos_token=eos_text)
                out["chat"].append({"messages": conv, "add_generation_prompt": gen, "text": text})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
