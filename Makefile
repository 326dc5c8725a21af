# Thin wrapper over CMake so the README's two commands are `make demo` and
# `make test`. Both install missing Debian packages first (quietly when none
# are missing), then configure and build.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

.PHONY: all deps build demo test test-fast test-asan python-test format format-check clean

all: build

deps:
	@./scripts/deps.sh

$(BUILD)/CMakeCache.txt: | deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

build: deps $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/epx demo

# The whole suite (the formatting check first), then once more under ASan+UBSan.
test: format-check test-fast test-asan python-test

# .clang-format applied (format) or checked (format-check); scripts/format.sh
# lists the paths it leaves alone.
format:
	@./scripts/format.sh

format-check:
	@./scripts/format.sh --check

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DEPX_SANITIZE=ON $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -LE no-asan

python-test:
	@if [ -f python/pyproject.toml ]; then ./scripts/python-test.sh; fi

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
