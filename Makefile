# Thin wrapper over CMake so the README's two commands are `make demo` and
# `make test`. Both install missing Debian packages first (quietly when none
# are missing), then configure and build.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
PREFIX     ?= /usr/local
# V=1 shows the compiler's output; by default it goes to $(BUILD)/build.log
# and only its tail is shown when something fails.
V          ?= 0
ifeq ($(V),1)
LOG :=
else
LOG = >>$(BUILD)/build.log 2>&1 || { tail -n 25 $(BUILD)/build.log; echo "epx: build failed; the whole log is $(BUILD)/build.log"; exit 1; }
endif
# Everything: tests, CUDA kernels and MPI when found.
FULL_ARGS  = -DCMAKE_BUILD_TYPE=Release -DEPX_BUILD_TESTS=ON -DEPX_WITH_CUDA=ON -DEPX_WITH_MPI=ON

.PHONY: all deps build demo demo-build install test test-fast test-asan test-tsan python-test peer-test format format-check fuzz clean bench-plan

all: build

deps:
	@./scripts/deps.sh

# `make build` (and `make test`) configure everything; a tree first made by
# `make demo` is switched to the full set here.
build: deps
	@mkdir -p $(BUILD) && : >$(BUILD)/build.log
	@cmake -S . -B $(BUILD) $(FULL_ARGS) $(CMAKE_ARGS) $(LOG)
	@cmake --build $(BUILD) -j $(JOBS) $(LOG)

# The first run: only the CLI and its library (no CUDA, no tests, no MPI)
# on a fresh clone; an existing tree is reused as it is.
demo-build: deps
	@mkdir -p $(BUILD) && : >$(BUILD)/build.log
	@if [ ! -f $(BUILD)/CMakeCache.txt ]; then \
	  echo "epx: configuring $(BUILD)/ for the CLI only (make test builds the rest)"; \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DEPX_BUILD_TESTS=OFF \
	    -DEPX_WITH_CUDA=OFF -DEPX_WITH_MPI=OFF $(CMAKE_ARGS) $(LOG); fi
	@echo "epx: building ./$(BUILD)/epx (log: $(BUILD)/build.log; V=1 to watch)"
	@cmake --build $(BUILD) --target epx_cli -j $(JOBS) $(LOG)

demo: demo-build
	./$(BUILD)/epx demo

# Planning time of HEAD beside BASE's, alternating, same inputs (issue 30):
# make bench-plan BASE=eb82a5a [RUNS=15]
bench-plan: demo-build
	@test -n "$(BASE)" || { echo "make bench-plan needs BASE=<commit>"; exit 2; }
	@python3 scripts/bench_plan.py --base $(BASE) --runs $(or $(RUNS),15) --head $(BUILD)/epx

# Copy the CLI, the shared library and the headers under PREFIX.
install: demo-build
	@cmake --build $(BUILD) --target epx -j $(JOBS) $(LOG)
	install -d $(PREFIX)/bin $(PREFIX)/lib $(PREFIX)/include/epx
	install -m 755 $(BUILD)/epx $(PREFIX)/bin/epx
	install -m 644 $(BUILD)/libepx.so $(PREFIX)/lib/libepx.so
	install -m 644 include/*.h $(PREFIX)/include/
	install -m 644 include/epx/*.h $(PREFIX)/include/epx/

# The whole suite (the formatting check first), then once more under ASan+UBSan,
# and the tests whose threads stand for a GPU's lanes under TSan.
# The Python tests come before ctest so their venv (with torch) is there for
# tests/cli/pt_torch.sh, which checks epx's .pt files against torch itself.
test: format-check python-test test-fast test-asan test-tsan

# .clang-format applied (format) or checked (format-check); scripts/format.sh
# lists the paths it leaves alone.
format:
	@./scripts/format.sh

format-check:
	@./scripts/format.sh --check

# Each ctest run ends with every skipped test and its reason, and a count.
test-fast: build
	@cd $(BUILD) && { ctest --output-on-failure -j $(JOBS) --output-junit ctest.xml; rc=$$?; \
	  python3 $(CURDIR)/scripts/test-summary.py ctest.xml release; exit $$rc; }

test-asan: deps
	@mkdir -p $(ASAN_BUILD)
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DEPX_SANITIZE=ON $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) $(if $(filter 1,$(V)),,>$(ASAN_BUILD)/build.log 2>&1 || { tail -n 25 $(ASAN_BUILD)/build.log; exit 1; })
	@cd $(ASAN_BUILD) && { ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -LE no-asan \
	  --output-junit ctest.xml; rc=$$?; python3 $(CURDIR)/scripts/test-summary.py ctest.xml asan; exit $$rc; }

# ThreadSanitizer on test_balanced_lanes, whose 32 threads run the balanced
# solver's warp statements as the kernel's lanes do: a missing __syncwarp
# between one lane's write and another's read is a data race there as on the
# GPU. Only that target is built; a compiler without TSan skips it, saying so.
test-tsan: deps
	@mkdir -p $(TSAN_BUILD)
	@if ! echo 'int main(void) { return 0; }' | $${CC:-cc} -fsanitize=thread -x c - \
	  -o $(TSAN_BUILD)/probe >/dev/null 2>&1; then \
	  echo "tsan: skipped, $${CC:-cc} cannot build with -fsanitize=thread"; exit 0; fi; \
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEPX_BUILD_TESTS=ON \
	  -DEPX_WITH_CUDA=OFF -DEPX_WITH_MPI=OFF -DCMAKE_C_FLAGS=-fsanitize=thread \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread $(CMAKE_ARGS) >$(TSAN_BUILD)/build.log 2>&1 && \
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_balanced_lanes >>$(TSAN_BUILD)/build.log 2>&1 || \
	  { tail -n 25 $(TSAN_BUILD)/build.log; echo "tsan: build failed"; exit 1; }; \
	TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/test_balanced_lanes >$(TSAN_BUILD)/test.log 2>&1 || \
	  { tail -n 40 $(TSAN_BUILD)/test.log; echo "tsan: test_balanced_lanes failed"; exit 1; }; \
	echo "tsan: test_balanced_lanes passed, no data race"

# libFuzzer: every fuzz/fuzz_NAME.c built with clang (ASan+UBSan) into
# build-fuzz/ and run for FUZZ_SECONDS each on fuzz/corpus/NAME, which keeps
# what it finds (and crash-* inputs); `make test` replays that corpus.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZERS      ?= counts_json mapping_json pt model_config sglang_release
fuzz: deps
	@mkdir -p $(FUZZ_BUILD)
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DEPX_FUZZ=ON -DEPX_WITH_CUDA=OFF -DEPX_WITH_MPI=OFF $(CMAKE_ARGS) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZERS)) >/dev/null
	@for f in $(FUZZERS); do \
	  echo "epx: fuzzing $$f for $(FUZZ_SECONDS) s (corpus fuzz/corpus/$$f)"; \
	  dict=""; [ -f fuzz/$$f.dict ] && dict="-dict=fuzz/$$f.dict"; \
	  ./$(FUZZ_BUILD)/fuzz_$$f fuzz/corpus/$$f $$dict -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=fuzz/corpus/$$f/crash- -print_final_stats=1 >$(FUZZ_BUILD)/$$f.log 2>&1; \
	  rc=$$?; tail -n 8 $(FUZZ_BUILD)/$$f.log; [ $$rc = 0 ] || { echo "epx: fuzz_$$f failed: $(FUZZ_BUILD)/$$f.log"; exit 1; }; \
	done

python-test:
	@if [ -f python/pyproject.toml ]; then ./scripts/python-test.sh; fi

# The engines' own unit tests (vLLM's test_eplb_algo.py of five releases,
# SGLang's dispatch-table test) run unchanged against epx and against the
# engines' own code, and epx's vLLM plugin runs through vLLM's own plugin
# loader and policy table (tools/peer_test.py); downloads into $(BUILD)/peer-test,
# skips with the reason when PyPI is unreachable. SGLANG_TEST=FILE names
# SGLang 0.5.16's unit test, which PyPI does not carry.
SGLANG_TEST ?=
peer-test:
	@EPX_PY_BUILD=$(BUILD)/python EPX_PY_SETUP_ONLY=1 ./scripts/python-test.sh
	@python3 tools/peer_test.py --cache $(BUILD)/peer-test --python $(BUILD)/python/venv/bin/python \
	  $(if $(SGLANG_TEST),--sglang-test $(SGLANG_TEST))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
