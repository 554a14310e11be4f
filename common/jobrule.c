/* jobrule: see jobrule.h. */
#include "jobrule.h"

#include <stdio.h>

uint64_t jobrule_eval_samples(uint64_t eval_batches, uint32_t batch_size, uint64_t test_samples) {
  uint64_t want = batch_size && eval_batches > UINT64_MAX / batch_size ? UINT64_MAX : eval_batches * batch_size;
  return test_samples && want > test_samples ? test_samples : want;
}

uint64_t jobrule_train_tail(uint64_t iterations) {
  uint64_t k = iterations / 10;
  return k ? k : (iterations ? 1 : 0);
}

void jobrule_train_logloss_definition(uint64_t iterations, char *out, size_t n) {
  snprintf(out, n,
           "mean of the per-iteration training logloss over the last 10%% of iterations, at least one: the last %llu "
           "of %llu",
           (unsigned long long)jobrule_train_tail(iterations), (unsigned long long)iterations);
}

/* "5.7" copies; two decimals just above one, where one would say "1.0" */
static void copies(uint32_t batch, uint64_t split, char *out, size_t n) {
  double r = (double)batch / (double)split;
  snprintf(out, n, "%.*f", r < 1.1 ? 2 : 1, r);
}

int jobrule_batch_notes(uint32_t batch_size, uint64_t train_samples, uint64_t test_samples, uint64_t eval_batches,
                        int strict, char notes[2][JOBRULE_NOTE_MAX]) {
  int k = 0;
  char c[32];
  unsigned long long tr = (unsigned long long)train_samples, te = (unsigned long long)test_samples;
  if (train_samples && batch_size > train_samples) {
    copies(batch_size, train_samples, c, sizeof c);
    if (strict)
      snprintf(notes[k], JOBRULE_NOTE_MAX,
               "strict = true refuses batch_size = %u: it is larger than the train split (%llu samples), each batch "
               "would hold %s copies of the training set; lower batch_size to at most %llu, use more data, or set "
               "strict = false",
               batch_size, tr, c, tr);
    else
      snprintf(notes[k], JOBRULE_NOTE_MAX,
               "batch_size = %u is larger than the train split (%llu samples): each batch holds %s copies of the "
               "training set; lower batch_size to at most %llu or use more data (strict = true refuses this)",
               batch_size, tr, c, tr);
    k++;
  }
  if (eval_batches && test_samples && batch_size > test_samples) {
    copies(batch_size, test_samples, c, sizeof c);
    if (strict)
      snprintf(notes[k], JOBRULE_NOTE_MAX,
               "strict = true refuses batch_size = %u: it is larger than the test split (%llu samples), a test batch "
               "would hold %s copies of it; lower batch_size to at most %llu, raise test_fraction, set "
               "eval_batches = 0, or set strict = false",
               batch_size, te, c, te);
    else
      snprintf(notes[k], JOBRULE_NOTE_MAX,
               "batch_size = %u is larger than the test split (%llu samples): a test batch holds %s copies of it; "
               "each evaluation scores the %llu test samples once (strict = true refuses this)",
               batch_size, te, c, te);
    k++;
  }
  return k;
}
