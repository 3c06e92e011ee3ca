# loco — one hand-written Makefile. `make` builds build/loco and
# build/libloco.a; see README.md for run/test/bench/asan/clean/format.

CC      ?= cc
NVCC    ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
BUILD   ?= build
# x86-64-v3 (AVX2/FMA) where the CPU has it: the codecs and kernels vectorise.
ARCH    ?= $(shell grep -q -m1 avx2 /proc/cpuinfo 2>/dev/null && echo x86-64-v3 || echo x86-64-v2)
OPT     ?= -O3
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -Wno-comment \
           $(OPT) -g -march=$(ARCH) -fopenmp -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread
# OpenMPI, through its compiler wrapper's flags (Debian's libopenmpi-dev).
MPI_CFLAGS ?= $(shell mpicc -showme:compile 2>/dev/null)
MPI_LIBS   ?= $(shell mpicc -showme:link 2>/dev/null)
CFLAGS  += $(MPI_CFLAGS)
LDLIBS  += -lopenblas -linih -lcjson -lxxhash -lzstd -lcurl -lmicrohttpd -lpcre2-8 -lssl -lcrypto $(MPI_LIBS) -lm -lpthread
LDFLAGS += -fopenmp

# The single source list: every .c file of the library rooms.
ROOMS   := core kernels/cpu inner/model inner/optim inner/ckpt inner/train inner/data \
           inner/comm inner/mesh inner/parallel compress net faulttol outer tokenizer report launch lab
SRCS    := $(foreach r,$(ROOMS),$(wildcard $(r)/*.c))
OBJS    := $(SRCS:%.c=$(BUILD)/%.o)
CLI_SRCS:= $(wildcard cli/*.c bench/*.c)
CLI_OBJS:= $(CLI_SRCS:%.c=$(BUILD)/%.o)
# tests/mpi/ holds programs run under mpirun by Criterion tests, not tests;
# tests/inner/ mirrors inner/'s sub-rooms one level deeper.
TEST_SRCS := $(filter-out tests/mpi/%,$(wildcard tests/*/*.c tests/inner/*/*.c))
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o)
# The tests of serving metrics link cli/'s server (the rest of cli/ has main).
TEST_CLI_OBJS := $(BUILD)/cli/metrics_http.o
CU_SRCS := $(wildcard kernels/cuda/*.cu inner/comm/*.cu)
CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.o)
NVFLAGS ?= -O3 -std=c++17 -I. -Werror all-warnings -gencode arch=compute_90,code=sm_90 \
           -gencode arch=compute_80,code=compute_80
# With a CUDA toolkit the library carries the CUDA twins (kernels/cuda,
# compress's codecs) and every C file sees LOCO_HAVE_CUDA; with NCCL there
# too, the nccl comm backend (LOCO_HAVE_NCCL). Without one, nothing CUDA
# is built and the GPU tests report that they were skipped.
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIB  ?= $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
NCCL_H    ?= $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
CFLAGS  += -DLOCO_HAVE_CUDA -I$(CUDA_HOME)/include
# cuBLASLt is not linked: kernels/cuda/matmul.cu opens it on first use (its
# load-time initialisation would cost every loco process ~0.4 s of CPU).
LDLIBS  += -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcudart -lstdc++
ifneq ($(NCCL_H),)
CFLAGS  += -DLOCO_HAVE_NCCL
NVFLAGS += -DLOCO_HAVE_NCCL
LDLIBS  += -lnccl
endif
OBJS    += $(CU_OBJS)
endif

LIB     := $(BUILD)/libloco.a
BIN     := $(BUILD)/loco
TESTBIN := $(BUILD)/tests/loco_tests

.PHONY: all rooms run test test-emu bench asan tsan clean format deps data data-bpe cuda fuzz print-ldlibs
all: rooms $(BIN) cuda

# The house's rules (docs/ARCHITECTURE.md's rooms table) against the code:
# a file that includes another room's internal header, or a room that
# includes one above it, fails the build.
rooms:
	@bash scripts/check-rooms.sh

# V=1 shows full commands.
Q := $(if $(V),,@)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(OBJS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN): $(CLI_OBJS) $(LIB)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(CLI_OBJS) $(LIB) $(LDLIBS)

# CUDA objects: built where the toolkit is, skipped with a notice elsewhere.
ifeq ($(NVCC),)
cuda:
	@echo "cuda: no CUDA toolkit found (nvcc); skipping kernels/cuda"
else
GPU_BENCH := $(BUILD)/loco-gpu-bench
cuda: $(CU_OBJS) $(GPU_BENCH)
	@echo "cuda: $(words $(CU_OBJS)) CUDA object(s) built with $(NVCC)"
# GPT-2 training steps on one GPU (scripts/gpu-check.sh).
$(GPU_BENCH): bench/gpu/gpt2_gpu.c kernels/kernels.h kernels/device.h inner/model/model.h inner/optim/optim.h \
              core/core.h $(LIB)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS) -lcublasLt
$(CU_OBJS): kernels/cuda/common.cuh kernels/kernels.h kernels/device.h core/core.h \
            inner/comm/internal.h inner/comm/comm.h
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVFLAGS) -c $< -o $@
endif

# One Criterion binary over every tests/<room>/*.c; per-room binaries
# (build/tests/test_core, ...) for quick iteration.
$(TESTBIN): $(TEST_OBJS) $(TEST_CLI_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(TEST_OBJS) $(TEST_CLI_OBJS) $(LIB) $(LDLIBS) -lcriterion

.SECONDEXPANSION:
$(BUILD)/tests/test_%: $(LIB) $(TEST_CLI_OBJS) $$(addprefix $(BUILD)/,$$(addsuffix .o,$$(basename $$(wildcard tests/$$*/*.c))))
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB) $(LDLIBS) -lcriterion


# Checks that need several ranks: standalone programs that the Criterion
# tests start under mpirun.
MPI_CHECK := $(BUILD)/tests/mpi_comm_check
$(MPI_CHECK): tests/mpi/mpi_comm_check.c tests/mpi/mpi_check.h inner/comm/comm.h $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -DLOCO_MPI_CHECK_MAIN $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)
PP_CHECK := $(BUILD)/tests/pipeline_exec_check
$(PP_CHECK): tests/mpi/pipeline_exec_check.c tests/mpi/mpi_check.h inner/parallel/parallel.h inner/comm/comm.h $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -DLOCO_PP_CHECK_MAIN $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# libFuzzer targets of fuzz/ (clang, ASan+UBSan), FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
fuzz:
	BUILD=$(BUILD) bash fuzz/run.sh $(FUZZ_SECONDS)

# The link libraries, for scripts that build the library their own way
# (fuzz/run.sh builds $(LIB) with clang and links its targets with these).
print-ldlibs:
	@echo $(LDLIBS)

deps:
	@bash scripts/install-deps.sh

data: $(BIN)
	@bash scripts/prep-data.sh

# The BPE variant of the default data (configs/tiny-bpe.ini).
data-bpe: $(BIN) data
	@LOCO=$(BIN) bash scripts/prep-data-bpe.sh

run: deps
	@$(MAKE) --no-print-directory all data
	$(BIN) train configs/tiny.ini

# Unit and integration tests; `make test` is what CI runs.
test: deps
	@$(MAKE) --no-print-directory all data $(TESTBIN) $(MPI_CHECK) $(PP_CHECK)
ifneq ($(NVCC),)
	@echo "test: building loco without CUDA too (build-nocuda: what a machine without the toolkit compiles)"
	@$(MAKE) --no-print-directory NVCC= BUILD=build-nocuda build-nocuda/loco
endif
	@NVCC="$(NVCC)" CUDA_LIB="$(CUDA_LIB)" BUILD=$(BUILD) bash tests/run.sh

# The whole kernel emulator (tests/gpu/emu), full sizes, both thread orders;
# `make test` runs its CI part (tests/gpu/emu/run.sh names what it leaves here).
test-emu: $(LIB)
ifeq ($(NVCC),)
	@echo "test-emu: no nvcc: the emulator needs the CUDA build (kernels/cuda in libloco.a)"; exit 1
else
	@CUDA_LIB="$(CUDA_LIB)" BUILD=$(BUILD) bash tests/gpu/emu/run.sh --full
endif

bench: deps
	@$(MAKE) --no-print-directory all data
	$(BIN) bench step

asan:
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer" \
		LDFLAGS="-fopenmp -fsanitize=address,undefined" build-asan/loco build-asan/tests/loco_tests \
		build-asan/tests/mpi_comm_check build-asan/tests/pipeline_exec_check
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
		LOCO_BIN=build-asan/loco OMPI_ALLOW_RUN_AS_ROOT=1 \
		OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 build-asan/tests/loco_tests --jobs 1

tsan:
	@$(MAKE) --no-print-directory BUILD=build-tsan OPT="-O1 -fsanitize=thread" \
		LDFLAGS="-fopenmp -fsanitize=thread" build-tsan/loco build-tsan/tests/loco_tests

format:
	clang-format -i $$(find core kernels inner compress net faulttol outer report launch cli tests bench \
		-name '*.c' -o -name '*.h' -o -name '*.cu' | grep -v config_keys.h)

clean:
	rm -rf build build-asan build-tsan build-nocuda

-include $(OBJS:.o=.d) $(CLI_OBJS:.o=.d) $(TEST_OBJS:.o=.d)
