/* llama.cpp's side of bench/device/scaling.sh: llama-bench's pp and tg tests through libllama's C API,
 * for machines where the reference Python (llama-cpp-python and numpy) cannot travel.
 *
 * Usage: lcpp_bench MODEL.gguf THREADS N_PROMPT N_GEN REPS [FLASH_ATTN 0|1] [DEPTH]
 *
 * Times llama_decode the way bench/lcpp_bench.py (and llama-bench) do: one context of
 * pad256(N_PROMPT + N_GEN) cells, one untimed warm-up per test, then REPS repetitions, each after
 * llama_memory_clear: ppN decodes one batch of N random tokens, tgN decodes N random tokens one at
 * a time, each followed by llama_synchronize; with DEPTH (llama-bench's -d) each repetition first
 * decodes DEPTH random tokens, untimed, in batches of 512. Prints one JSON object per test on stdout:
 *   {"test":"pp256","n_threads":16,"samples_ts":[...],"avg_ts":...}
 * Built by bench/device/pack.sh against the reference wheel's libllama (rpath $ORIGIN). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llama.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

/* xorshift64*: random token ids, the same sequence on every run. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static llama_token next_token(int32_t n_vocab) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (llama_token)((rng_state * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)n_vocab);
}

static int decode(struct llama_context *ctx, llama_token *toks, int32_t n) {
    int rc = llama_decode(ctx, llama_batch_get_one(toks, n));
    llama_synchronize(ctx);
    return rc;
}

/* One repetition: the prompt batch, then the generated tokens one by one; seconds, or < 0 on error. */
static double run_once(struct llama_context *ctx, int32_t n_vocab, int depth, int n_prompt, int n_gen,
                       llama_token *buf) {
    llama_memory_clear(llama_get_memory(ctx), true);
    for (int i = 0; i < depth + n_prompt + n_gen; i++) {
        buf[i] = next_token(n_vocab);
    }
    for (int i = 0; i < depth; i += 512) {
        if (decode(ctx, buf + i, depth - i < 512 ? depth - i : 512) != 0) {
            return -1.0;
        }
    }
    buf += depth;
    double t0 = now_s();
    if (n_prompt > 0 && decode(ctx, buf, n_prompt) != 0) {
        return -1.0;
    }
    for (int i = 0; i < n_gen; i++) {
        if (decode(ctx, buf + n_prompt + i, 1) != 0) {
            return -1.0;
        }
    }
    return now_s() - t0;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS N_PROMPT N_GEN REPS [FLASH_ATTN 0|1] [DEPTH]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int threads = atoi(argv[2]), n_prompt = atoi(argv[3]), n_gen = atoi(argv[4]), reps = atoi(argv[5]);
    int fa = argc > 6 ? atoi(argv[6]) : 0;
    int depth = argc > 7 ? atoi(argv[7]) : 0;
    if (depth < 0 || threads < 1 || n_prompt < 0 || n_gen < 0 || n_prompt + n_gen < 1 || reps < 1) {
        fprintf(stderr, "lcpp_bench: bad arguments\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    ggml_backend_load_all();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (model == NULL) {
        fprintf(stderr, "lcpp_bench: cannot load %s\n", path);
        return 1;
    }
    int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_context_params cp = llama_context_default_params();
    int cells = (depth + n_prompt + n_gen + 255) / 256 * 256;
    cp.n_ctx = (uint32_t)cells;
    cp.n_batch = (uint32_t)(n_prompt > 512 ? n_prompt : 512);
    cp.n_ubatch = cp.n_batch < 512 ? cp.n_batch : 512;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        fprintf(stderr, "lcpp_bench: cannot create a context\n");
        return 1;
    }
    llama_token *buf = malloc(sizeof(llama_token) * (size_t)(depth + n_prompt + n_gen));
    double *ts = malloc(sizeof(double) * (size_t)reps);
    if (buf == NULL || ts == NULL) {
        return 1;
    }
    /* The warm-up: the prompt batch (or one token), untimed. */
    if (run_once(ctx, n_vocab, 0, n_prompt, n_prompt > 0 ? 0 : 1, buf) < 0) {
        fprintf(stderr, "lcpp_bench: llama_decode failed\n");
        return 1;
    }
    double sum = 0.0;
    for (int r = 0; r < reps; r++) {
        double s = run_once(ctx, n_vocab, depth, n_prompt, n_gen, buf);
        if (s <= 0) {
            fprintf(stderr, "lcpp_bench: llama_decode failed\n");
            return 1;
        }
        ts[r] = (double)(n_prompt + n_gen) / s;
        sum += ts[r];
    }
    printf("{\"test\":\"%s%d\",\"n_threads\":%d,\"n_prompt\":%d,\"n_gen\":%d,\"n_depth\":%d,"
           "\"flash_attn\":%s,\"samples_ts\":[",
           n_prompt > 0 ? "pp" : "tg", n_prompt > 0 ? n_prompt : n_gen, threads, n_prompt, n_gen, depth,
           fa ? "true" : "false");
    for (int r = 0; r < reps; r++) {
        printf("%s%.4f", r ? "," : "", ts[r]);
    }
    printf("],\"avg_ts\":%.4f}\n", sum / reps);
    free(ts);
    free(buf);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
