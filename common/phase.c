/* phase: see phase.h. */
#include "phase.h"

#include "err.h"

static const char *const names[PHASE_N] = {
#define PHASE_NAME(id, name) #name,
    PHASE_LIST(PHASE_NAME)
#undef PHASE_NAME
};

const char *phase_name(int p) {
  ASSERT_OP(p, <, PHASE_N);
  return names[p];
}
