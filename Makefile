# The two commands of the quick start: `make demo` and `make test`. Both install what is
# missing, configure, build; then run the walkthrough or the whole test suite.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)

.PHONY: all deps configure build demo test test-asan clean format

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/bin/walkthrough

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The CPU test suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own build.
test-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
	cmake --build build-asan -j $(JOBS)
	# Tests exhaust memory on purpose: allocations that fail must return null, not abort. The
	# package test links the installed libraries into a project built without the sanitizers.
	ASAN_OPTIONS=allocator_may_return_null=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -E package_consumer

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR)
