# chanter: one non-recursive Makefile.
#
#   make            build everything into build/ (binaries in build/bin/)
#   make test       build and run every test (unit + integration)
#   make bench      build and run the benchmarks (prints tables)
#   make fuzz       build the libFuzzer targets (clang) and run each FUZZ_SECONDS=60
#   make demo       the README's main command
#   make deps       install the Debian packages the project needs
#   make clean
#   make print-VAR  a variable's value (print-INC_trainer: the trainer's include paths)
#
# Knobs: CUDA=auto|0|1   SANITIZER=address|undefined   WERROR=1|0   O=-O2

BUILD     ?= build
CC        ?= cc
CXX       ?= c++
CUDA      ?= auto
SANITIZER ?=
WERROR    ?= 1
O         ?= -O2
V         ?= 0
ifeq ($(V),0)
  Q := @
  say = @printf '  %-6s %s\n' $(1) $(2);
else
  Q :=
  say =
endif

PKGS := grpc gpr libprotobuf-c libuv rocksdb libsystemd libmicrohttpd gnutls libcrypto openblas libxxhash

# The flags below are read from pkg-config when make parses this file, so a
# build needs the packages installed *before* its make starts: `make demo`
# installs them and then builds in a second make (see demo:), and any other
# goal with packages missing stops here, in one line, before compiling
# anything (tests/integration/test_make_fresh.sh checks both).
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)
NO_DEPS_GOALS := deps demo clean
ifneq ($(if $(MAKECMDGOALS),$(filter-out $(NO_DEPS_GOALS),$(MAKECMDGOALS)),all),)
  ifeq ($(shell pkg-config --exists $(PKGS) cmocka 2>/dev/null && command -v protoc-c >/dev/null && echo ok),)
    $(error build dependencies are missing (pkg-config cannot find them, or protoc-c is not on PATH): run 'make demo' (installs them, builds, runs the demo) or 'make deps' (installs them only))
  endif
endif

WARN := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wformat=2 -Wno-format-nonliteral
ifeq ($(WERROR),1)
WARN += -Werror
endif

SAN :=
ifneq ($(SANITIZER),)
SAN := -fsanitize=$(SANITIZER) -fno-omit-frame-pointer
ifeq ($(SANITIZER),undefined)
SAN += -fno-sanitize-recover=undefined
endif
endif

SERVICES := $(notdir $(wildcard services/*))
# the include paths are per room (INC, below), not here
CPPFLAGS := -D_GNU_SOURCE $(PKG_CFLAGS)
CFLAGS   := -std=c11 $(O) -g -pthread $(WARN) $(SAN) -MMD -MP
# C++ only for the small extern "C" wrappers (common/*.cc: Gloo)
CXXFLAGS := -std=c++17 $(O) -g -pthread $(WARN) $(SAN) -MMD -MP
LDFLAGS  := -pthread $(SAN)
# libgloo (Debian, no .pc file) brings its own hiredis/ibverbs as NEEDED
LDLIBS   := $(PKG_LIBS) -lgloo -lstdc++ -lm

# ---- CUDA: on when nvcc is found (CUDA=auto), forced with CUDA=1, off with CUDA=0
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(CUDA),auto)
  ifneq ($(NVCC),)
    USE_CUDA := 1
  else
    USE_CUDA := 0
  endif
else
  USE_CUDA := $(CUDA)
endif
ifeq ($(USE_CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found; install the CUDA toolkit or use CUDA=0)
  endif
  CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
  # C files that call the CUDA runtime (common/model/cuda_check.c) see its headers
  CPPFLAGS += -DCHANTER_CUDA=1 -I$(CUDA_HOME)/include
endif
# A directory's *.cu objects go into the library of its *.c, next to the C
# reference they mirror; cu_objs DIR gives them (none with CUDA=0), and
# cu_all DIR whether built or not (for their INC)
cu_all  = $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(wildcard $(1)/*.cu))
cu_objs = $(if $(filter 1,$(USE_CUDA)),$(call cu_all,$(1)))
ifeq ($(USE_CUDA),1)
  # rpath: the binaries find libcudart & co. where ldconfig does not look
  LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lnccl -lstdc++
endif
# GPU code: SASS for Turing (sm_75, e.g. T4), Ampere (sm_80; also runs on
# 8.6/8.9) and Hopper (sm_90), plus compute_90 PTX that newer GPUs JIT.
# sm_75 is the oldest CUDA 13 compiles for (cuda_check.c's MIN_CC), so no
# GPU is needed to build.  Override e.g. CUDA_ARCHS="-arch=native".
CUDA_ARCHS ?= -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
              -gencode arch=compute_90,code=[sm_90,compute_90]
comma := ,
# --fmad=false: no FMA contraction, as C11 (-std=c11) has none on the CPU,
# so the element-wise kernels of nn.cu give nn.c's bits.  -fPIC: the
# objects may end up in a shared library or a PIE.
NVCCFLAGS := -O2 -g -std=c++17 --fmad=false $(CUDA_ARCHS) \
             -Xcompiler -fPIC,-Wall,-Wextra$(if $(filter 1,$(WERROR)),$(comma)-Werror) \
             $(if $(filter 1,$(WERROR)),-Werror all-warnings) -MMD -MP
$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(call say,NVCC,$@)$(NVCC) $(NVCCFLAGS) $(INC) -c -o $@ $<

# ---- generated protobuf-c code
PROTOS   := $(wildcard proto/*.proto)
PB_C     := $(patsubst proto/%.proto,$(BUILD)/gen/%.pb-c.c,$(PROTOS))
PB_H     := $(PB_C:.c=.h)

$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	$(call say,PROTOC,$<)protoc-c --c_out=$(BUILD)/gen -Iproto $<

# ---- rooms: who may include what, and what links what
# common/*.c is the runtime every daemon shares (libchanter.a).  A library
# with a life of its own is a room common/<lib>/ with its own
# libchanter_<lib>.a, built with -Icommon only (a file's own directory is
# searched first, so a room reaches its own headers anyway): it knows no
# daemon, and not the generated protobuf code either.  Each daemon and the
# CLI list the libraries they use (USES_*); their include paths (INC_*) and
# their link lines both come from that one list, and no room has another
# daemon's directory on its path, so including another daemon's header
# fails to compile (tests/integration/test_layout.sh checks; `make
# print-INC_trainer` shows a room's paths).
LIBS := model plan store
USES_trainer   := model
USES_oracle    := plan model
USES_embedding := store
USES_dataproc  :=
USES_cli       := model plan store
GEN_INC := -I$(BUILD)/gen
INC_common := -Icommon $(GEN_INC)
$(foreach l,$(LIBS),$(eval INC_$(l) := -Icommon))
$(foreach s,$(SERVICES),$(eval INC_$(s) := -Icommon $(addprefix -Icommon/,$(USES_$(s))) -Iservices/$(s) $(GEN_INC)))
INC_cli := -Icommon $(addprefix -Icommon/,$(USES_cli)) $(GEN_INC)
lib_files = $(foreach l,$(1),$(BUILD)/lib/libchanter_$(l).a)

# ---- common/: the shared runtime, one static library
COMMON_SRCS := $(wildcard common/*.c)
COMMON_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(COMMON_SRCS)) \
               $(patsubst %.cc,$(BUILD)/obj/%.cc.o,$(wildcard common/*.cc)) \
               $(patsubst $(BUILD)/gen/%.c,$(BUILD)/obj/gen/%.o,$(PB_C))
LIBCHANTER  := $(BUILD)/lib/libchanter.a
$(COMMON_OBJS) $(call cu_all,common): INC := $(INC_common)

# ---- common/<lib>/: the libraries with a life of their own
define lib_rules
LIB_$(1)_OBJS := $$(patsubst %.c,$(BUILD)/obj/%.o,$$(wildcard common/$(1)/*.c))
$$(LIB_$(1)_OBJS) $$(call cu_all,common/$(1)): INC := $$(INC_$(1))
$(BUILD)/lib/libchanter_$(1).a: $$(LIB_$(1)_OBJS) $$(call cu_objs,common/$(1))
	@mkdir -p $$(@D)
	$$(call say,AR,$$@)rm -f $$@ && ar rcs $$@ $$^
endef
$(foreach l,$(LIBS),$(eval $(call lib_rules,$(l))))

# The default cost model of the sharding planner (common/plan/shard_cost.h):
# deploy/shard/cost_model.txt, when the tree has one, as a C string in
# libchanter_plan.a, so an installed binary carries it (empty: no default).
# Rewritten only when its bytes change, so a build without changes
# recompiles nothing.
SHARD_MODEL := deploy/shard/cost_model.txt
$(BUILD)/gen/shard_cost_default.c: FORCE
	@mkdir -p $(@D)
	$(Q){ echo '/* generated by the Makefile from $(SHARD_MODEL) (absent: no default model) */'; \
	  echo '#include <stddef.h>'; echo 'const char shard_cost_default_text[] = {'; \
	  if [ -f $(SHARD_MODEL) ]; then od -An -v -tx1 $(SHARD_MODEL) | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; fi; \
	  echo '0};'; echo 'const size_t shard_cost_default_len = sizeof shard_cost_default_text - 1;'; } >$@.tmp
	$(Q)if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/lib/libchanter_plan.a: $(BUILD)/obj/gen/shard_cost_default.o
.PHONY: FORCE

# ---- services/<name>/: main.c wires, the rest is a library tests can link
define service_rules
SVC_$(1)_SRCS := $$(filter-out services/$(1)/main.c,$$(wildcard services/$(1)/*.c))
SVC_$(1)_OBJS := $$(patsubst %.c,$(BUILD)/obj/%.o,$$(SVC_$(1)_SRCS))
$$(SVC_$(1)_OBJS) $(BUILD)/obj/services/$(1)/main.o $$(call cu_all,services/$(1)): INC := $$(INC_$(1))
$(BUILD)/lib/libsvc_$(1).a: $$(SVC_$(1)_OBJS) $$(call cu_objs,services/$(1))
	@mkdir -p $$(@D)
	$$(call say,AR,$$@)rm -f $$@ && ar rcs $$@ $$^
ifneq ($(wildcard services/$(1)/main.c),)
BINS += $(BUILD)/bin/chanter-$(1)
$(BUILD)/bin/chanter-$(1): $(BUILD)/obj/services/$(1)/main.o $(BUILD)/lib/libsvc_$(1).a \
                         $$(call lib_files,$$(USES_$(1))) $(LIBCHANTER)
	@mkdir -p $$(@D)
	$$(call say,LD,$$@)$$(CC) $$(LDFLAGS) -o $$@ $$^ $$(LDLIBS)
endif
endef
$(foreach s,$(SERVICES),$(eval $(call service_rules,$(s))))

# ---- the CLI (tools/chanter/), which also carries the benchmarks: it
# reaches the daemons only through the libraries or the daemon binaries
CLI_SRCS := $(wildcard tools/chanter/*.c)
CLI_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(CLI_SRCS))
$(CLI_OBJS): INC := $(INC_cli)
BINS += $(BUILD)/bin/chanter
$(BUILD)/bin/chanter: $(CLI_OBJS) $(call lib_files,$(USES_cli)) $(LIBCHANTER)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# ---- unit tests: tests/unit/test_*.c, one binary each, cmocka
TEST_SRCS := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
# test_<service>_*.c gets that service's include paths and links its
# library and the libraries it uses; test_<lib>_*.c that library alone;
# test_job_*.c (a whole job simulated in one process) every service and
# every library; any other test, common/ alone.
test_svcs = $(if $(filter test_job_%,$(1)),$(SERVICES),$(foreach s,$(SERVICES),$(if $(filter test_$(s)_%,$(1)),$(s))))
test_libs = $(if $(filter test_job_%,$(1)),$(LIBS),$(foreach s,$(call test_svcs,$(1)),$(USES_$(s))) \
              $(foreach l,$(LIBS),$(if $(filter test_$(l)_%,$(1)),$(l))))
define test_rule
$(BUILD)/obj/tests/unit/$(1).o: INC := -Icommon $(addprefix -Icommon/,$(call test_libs,$(1))) \
                                       $(addprefix -Iservices/,$(call test_svcs,$(1))) $(GEN_INC)
$(BUILD)/tests/$(1): $(BUILD)/obj/tests/unit/$(1).o $(foreach s,$(call test_svcs,$(1)),$(BUILD)/lib/libsvc_$(s).a) \
                     $(call lib_files,$(call test_libs,$(1))) $(LIBCHANTER)
	@mkdir -p $$(@D)
	$$(call say,LD,$$@)$$(CC) $$(LDFLAGS) -o $$@ $$^ $$(LDLIBS) $$(CMOCKA_LIBS)
endef
$(foreach t,$(patsubst tests/unit/%.c,%,$(TEST_SRCS)),$(eval $(call test_rule,$(t))))

# ---- objects
ALL_OBJS := $(COMMON_OBJS) $(CLI_OBJS) $(foreach l,$(LIBS),$(LIB_$(l)_OBJS)) \
            $(foreach s,$(SERVICES),$(SVC_$(s)_OBJS) $(BUILD)/obj/services/$(s)/main.o) \
            $(patsubst tests/unit/%.c,$(BUILD)/obj/tests/unit/%.o,$(TEST_SRCS)) \
            $(foreach d,common $(addprefix common/,$(LIBS)) $(addprefix services/,$(SERVICES)),$(call cu_objs,$(d)))

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c $(PB_H)
	@mkdir -p $(@D)
	$(call say,CC,$@)$(CC) $(CPPFLAGS) $(filter-out -Wshadow,$(CFLAGS)) -c -o $@ $<

$(BUILD)/obj/%.o: %.c $(PB_H)
	@mkdir -p $(@D)
	$(call say,CC,$@)$(CC) $(CPPFLAGS) $(INC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/%.cc.o: %.cc $(PB_H)
	@mkdir -p $(@D)
	$(call say,CXX,$@)$(CXX) $(CPPFLAGS) $(INC) $(CXXFLAGS) -c -o $@ $<

$(LIBCHANTER): $(COMMON_OBJS) $(call cu_objs,common)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

.SECONDARY:
.PHONY: all test unit integration bench demo deps clean check-deps
.DEFAULT_GOAL := all
all: check-deps $(BINS) $(TEST_BINS)

check-deps:
	@pkg-config --exists $(PKGS) cmocka || { \
	  echo "missing build dependencies: run 'make deps' (tools/install-deps.sh)" >&2; exit 1; }
	@command -v protoc-c >/dev/null || { echo "protoc-c not found: run 'make deps'" >&2; exit 1; }
	@case "$$(pkg-config --modversion grpc)" in 29.*) ;; *) \
	  echo "gRPC core $$(pkg-config --modversion grpc) found; chanter is pinned to core 29.x (gRPC 1.51, Debian 12)" >&2; exit 1;; esac

deps:
	$(DEPS_INSTALL)

# make test: every unit test binary, then every integration test, one summary
test: all
	tests/run.sh $(BUILD)

unit: all
	tests/run.sh $(BUILD) unit

bench: all
	$(BUILD)/bin/chanter bench embedding
	$(BUILD)/bin/chanter bench dataproc
	$(BUILD)/bin/chanter bench feed
	$(BUILD)/bin/chanter bench model
	$(BUILD)/bin/chanter bench model --device cuda
	$(BUILD)/bin/chanter bench oracle
	$(BUILD)/bin/chanter bench tables --quick --out $(BUILD)/tables.dataset
	$(BUILD)/bin/chanter bench e2e
	$(BUILD)/bin/chanter bench checkpoint
	$(BUILD)/bin/chanter bench recovery
	$(BUILD)/bin/chanter bench shard
	$(BUILD)/bin/chanter --set iterations=150 bench placement --job deploy/jobs/dlrmv2-hetero.ini --trainers 2,4
	$(BUILD)/bin/chanter bench scale

# ---- fuzzing: make fuzz [FUZZ_SECONDS=60]
# libFuzzer targets, tests/fuzz/fuzz_*.c, one per parser of untrusted bytes
# (request decoders, the job file, the data readers, the manifest).  They
# and every library they link are built by clang in their own tree,
# FUZZ_BUILD, by a second make of this same file with BUILD=$(FUZZ_BUILD)
# and FUZZ_VARS (SANITIZER=fuzzer-no-link,address: the libraries are
# instrumented for coverage and ASan but get no main; the targets alone
# link -fsanitize=fuzzer).  fuzz_<service>_*.c links that service's
# library and the libraries it uses, as the unit tests do; any other
# target common/ alone.  tests/fuzz/run.sh then runs each target for
# FUZZ_SECONDS from its seeds tests/fuzz/corpus/<target>/ (what it finds
# goes to $(FUZZ_BUILD)/corpus/, the tree's corpora stay small) and fails
# on a crash.  `make test` replays the seeds once
# (tests/integration/test_fuzz_corpus.sh, same build).  Needs clang (make deps).
FUZZ_BUILD   ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 60
FUZZ_VARS    := BUILD=$(FUZZ_BUILD) CC=clang CXX=clang++ SANITIZER=fuzzer-no-link,address CUDA=0 WERROR=0
FUZZ_SRCS    := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS    := $(patsubst tests/fuzz/%.c,$(BUILD)/bin/%,$(FUZZ_SRCS))
fuzz_svcs = $(foreach s,$(SERVICES),$(if $(filter fuzz_$(s)_%,$(1)),$(s)))
define fuzz_rule
$(BUILD)/bin/$(1): tests/fuzz/$(1).c $(foreach s,$(call fuzz_svcs,$(1)),$(BUILD)/lib/libsvc_$(s).a) \
                   $(call lib_files,$(foreach s,$(call fuzz_svcs,$(1)),$(USES_$(s)))) $(LIBCHANTER) $(PB_H)
	@mkdir -p $$(@D)
	$$(call say,FUZZ,$$@)$$(CC) $$(CPPFLAGS) -Icommon $$(foreach s,$$(call fuzz_svcs,$(1)),-Iservices/$$(s) \
	  $$(addprefix -Icommon/,$$(USES_$$(s)))) $(GEN_INC) $$(filter-out -MMD -MP,$$(CFLAGS)) -fsanitize=fuzzer \
	  -o $$@ $$< $$(filter %.a,$$^) $$(LDLIBS)
endef
$(foreach t,$(patsubst tests/fuzz/%.c,%,$(FUZZ_SRCS)),$(eval $(call fuzz_rule,$(t))))
.PHONY: fuzz fuzz-targets fuzz-build
# fuzz-targets: only build them; fuzz-build is its half inside the make
# FUZZ_VARS sets up (not to be called on its own)
fuzz-build: $(FUZZ_BINS)
fuzz-targets:
	@command -v clang >/dev/null || { echo "clang not found: run 'make deps' (tools/install-deps.sh)" >&2; exit 1; }
	$(MAKE) $(FUZZ_VARS) fuzz-build
fuzz: fuzz-targets
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# Three steps, not prerequisites: the build must be a new make that parses
# this file after the packages are installed (PKG_LIBS above). The `+`
# runs the install under `make -n` too, as make does for $(MAKE) lines.
DEPS_INSTALL ?= tools/install-deps.sh
demo:
	+$(DEPS_INSTALL)
	$(MAKE) $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 2)) all
	tools/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD)

# make print-VAR: a variable's value (e.g. print-INC_trainer, print-CPPFLAGS)
print-%:
	@printf '%s\n' '$($*)'

-include $(ALL_OBJS:.o=.d)
