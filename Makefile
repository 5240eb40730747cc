# Thin wrapper over CMake. The two commands the README opens with:
#   make demo   set up, build, and run the end-to-end demo
#   make test   set up, build, and run every test
# Others: test-asan (ASan+UBSan), test-tsan, fuzz (FUZZ_SECONDS each target),
# test-gpu (the `gpu` tests on a real CUDA driver; needs a GPU, installs nothing),
# bench, format, install (PREFIX), clean.

JOBS ?= $(shell nproc)
WERROR ?= $(if $(CI),ON,OFF)
FUZZ_SECONDS ?= 60
PREFIX ?= /usr/local
CMAKE_FLAGS ?=
# Extra ctest arguments for `make test`, e.g. CTEST_ARGS='-E cli_readme'.
CTEST_ARGS ?=

define configure
	cmake -S . -B $(1) -DECT_WERROR=$(WERROR) $(CMAKE_FLAGS) $(2) >/dev/null
	cmake --build $(1) -j $(JOBS)
endef

.PHONY: all deps build demo test test-asan test-tsan test-gpu fuzz bench format install clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	$(call configure,build,)

demo: build
	./build/ect demo

test: build
	ctest --test-dir build --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-asan: deps
	$(call configure,build-asan,-DCMAKE_BUILD_TYPE=Debug -DECT_SANITIZE=address)
	UCX_ERROR_SIGNALS= ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

test-tsan: deps
	$(call configure,build-tsan,-DCMAKE_BUILD_TYPE=Debug -DECT_SANITIZE=thread)
	UCX_ERROR_SIGNALS= UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -j $(JOBS)

# GPU checks on the real driver: absent CUDA is a failure here (ECT_REQUIRE_GPU),
# a skip in `make test`. gpu_python runs tests/python/test_cuda.py with
# $ECT_PYTHON (an interpreter whose torch has CUDA). No `deps`: GPU machines may
# reach no package registry (scripts/gpu-check.sh builds with packed libraries
# and runs this and the benches).
test-gpu:
	$(call configure,build,)
	ECT_REQUIRE_GPU=1 ctest --test-dir build --output-on-failure -L gpu

fuzz: deps
	CC=clang $(call configure,build-fuzz,-DECT_FUZZ=ON -DECT_BUILD_TESTS=OFF)
	bash scripts/run-fuzz.sh build-fuzz/fuzz $(FUZZ_SECONDS)

bench: build
	./build/ect bench

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

install: build
	cmake --install build --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-tsan build-fuzz
