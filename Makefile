# The two commands of the quick start: `make demo` and `make test`. Both install what is
# missing, configure, build; then run the walkthrough or the whole test suite.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)

.PHONY: all deps configure build demo test test-asan fuzz-parser fuzz-parser-build fuzz-parser-merge \
	fuzz-pipeline fuzz-pipeline-merge fuzz-eval fuzz-eval-merge fuzz-safetensors \
	fuzz-safetensors-merge \
  clean format

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
	$(BUILD_DIR)/bin/linear_regression
	$(BUILD_DIR)/bin/mlp_classifier
	$(BUILD_DIR)/bin/gpt2 --synthetic

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The CPU test suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own build.
test-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
	cmake --build build-asan -j $(JOBS)
	# Tests exhaust memory on purpose: allocations that fail must return null, not abort. The
	# package test links the installed libraries into a project built without the sanitizers.
	# intercept_tls_get_addr=0: the sanitizer runtime tracks a dlopen'd library's thread-local
	# blocks by guessing at glibc's allocation header, and where the guess read a stray word
	# LeakSanitizer's exit scan crashed on a range of garbage ("Tracer caught signal 11",
	# "DTLS ... at 0x00020000179b-0x00230000289d" with LSAN_OPTIONS=verbosity=1), now and then,
	# after the test had passed, in processes that had loaded LLVM for the CPU JIT or NVRTC.
	ASAN_OPTIONS=allocator_may_return_null=1:intercept_tls_get_addr=0 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -E package_consumer

# The IR text parser, verifier and printer under libFuzzer with ASan and UBSan, in a build of
# their own (build-libfuzzer, clang-14; Debian: clang-14 libclang-rt-14-dev). Runs FUZZ_TIME
# seconds from the committed corpus, with FUZZ_FLAGS as more libFuzzer flags; new inputs go to
# build-libfuzzer/corpus, crashing ones to build-libfuzzer/findings/. `make fuzz-parser-merge`
# then adds those that cover something new to the committed corpus, which the test suite
# replays (IrCorpus.EveryInputPassesTheFuzzersChecks).
FUZZ_TIME ?= 300
FUZZ_FLAGS ?=
FUZZ_CORPUS = tests/fuzz/corpus/ir_parser

fuzz-parser-build: deps
	@command -v clang++-14 >/dev/null || \
	  { echo "the fuzzers need clang++-14, libclang-rt-14-dev and libomp-14-dev"; exit 1; }
	cmake -S tests/fuzz -B build-libfuzzer -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build-libfuzzer -j $(JOBS)

fuzz-parser: fuzz-parser-build
	mkdir -p build-libfuzzer/corpus build-libfuzzer/findings
	cd build-libfuzzer && ./ir_parser_fuzzer corpus ../$(FUZZ_CORPUS) -dict=../tests/fuzz/ir.dict \
	  -max_total_time=$(FUZZ_TIME) -jobs=1 -workers=1 -artifact_prefix=findings/ \
	  -print_final_stats=1 $(FUZZ_FLAGS)
	@grep -E '^(#[0-9]+.*DONE|stat::)' build-libfuzzer/fuzz-0.log || tail -n 20 build-libfuzzer/fuzz-0.log
	@if [ -n "$$(ls build-libfuzzer/findings)" ]; then \
	  echo "findings: $$(ls build-libfuzzer/findings)"; exit 1; fi

fuzz-parser-merge: fuzz-parser-build
	build-libfuzzer/ir_parser_fuzzer -merge=1 $(FUZZ_CORPUS) build-libfuzzer/corpus

# Past the IR text, in the same build: graphs that parse and verify go through the pass
# pipeline (verified between passes) and both code generators. Seeded from its own corpus, the
# IR text fuzzer's and tests/filecheck; new inputs go to build-libfuzzer/pipeline-corpus,
# findings to build-libfuzzer/pipeline-findings/. `make fuzz-pipeline-merge` adds what covers
# something new to the committed corpus (IrCorpus.EveryInputPassesThePipelineFuzzersChecks).
PIPELINE_CORPUS = tests/fuzz/corpus/ir_pipeline

fuzz-pipeline: fuzz-parser-build
	mkdir -p build-libfuzzer/pipeline-corpus build-libfuzzer/pipeline-findings
	cd build-libfuzzer && ./ir_pipeline_fuzzer pipeline-corpus ../$(PIPELINE_CORPUS) \
	  ../$(FUZZ_CORPUS) ../tests/filecheck -dict=../tests/fuzz/ir.dict \
	  -max_total_time=$(FUZZ_TIME) -jobs=1 -workers=1 -artifact_prefix=pipeline-findings/ \
	  -print_final_stats=1 $(FUZZ_FLAGS)
	@grep -E '^(#[0-9]+.*DONE|stat::)' build-libfuzzer/fuzz-0.log || tail -n 20 build-libfuzzer/fuzz-0.log
	@if [ -n "$$(ls build-libfuzzer/pipeline-findings)" ]; then \
	  echo "findings: $$(ls build-libfuzzer/pipeline-findings)"; exit 1; fi

fuzz-pipeline-merge: fuzz-parser-build
	mkdir -p $(PIPELINE_CORPUS)
	build-libfuzzer/ir_pipeline_fuzzer -merge=1 $(PIPELINE_CORPUS) build-libfuzzer/pipeline-corpus

# Through evaluation, in the same build: small CPU graphs (at most 64 nodes of 2^16 elements)
# that parse and verify are evaluated fused and unfused by the runtime, and must agree bit for
# bit. Seeded from its own corpus and the pipeline fuzzer's; new inputs go to
# build-libfuzzer/eval-corpus, findings to build-libfuzzer/eval-findings/. `make
# fuzz-eval-merge` adds what covers something new to the committed corpus
# (IrCorpus.EveryInputPassesTheEvaluationFuzzersChecks).
EVAL_CORPUS = tests/fuzz/corpus/ir_eval

fuzz-eval: fuzz-parser-build
	mkdir -p build-libfuzzer/eval-corpus build-libfuzzer/eval-findings
	cd build-libfuzzer && OMP_NUM_THREADS=1 ./ir_eval_fuzzer eval-corpus ../$(EVAL_CORPUS) \
	  ../$(PIPELINE_CORPUS) -dict=../tests/fuzz/ir.dict -max_total_time=$(FUZZ_TIME) -jobs=1 \
	  -workers=1 -artifact_prefix=eval-findings/ -print_final_stats=1 $(FUZZ_FLAGS)
	@grep -E '^(#[0-9]+.*DONE|stat::)' build-libfuzzer/fuzz-0.log || tail -n 20 build-libfuzzer/fuzz-0.log
	@if [ -n "$$(ls build-libfuzzer/eval-findings)" ]; then \
	  echo "findings: $$(ls build-libfuzzer/eval-findings)"; exit 1; fi

fuzz-eval-merge: fuzz-parser-build
	mkdir -p $(EVAL_CORPUS)
	OMP_NUM_THREADS=1 build-libfuzzer/ir_eval_fuzzer -merge=1 $(EVAL_CORPUS) build-libfuzzer/eval-corpus

# The safetensors loader, in the same build: arbitrary bytes must be refused with a
# SerializationError, or load and come back the same through a save. Seeded from its own corpus
# and the PyTorch fixtures; new inputs go to build-libfuzzer/safetensors-corpus, findings to
# build-libfuzzer/safetensors-findings/. `make fuzz-safetensors-merge` adds what covers
# something new to the committed corpus (SafetensorsCorpus.EveryInputPassesTheFuzzersCheck).
SAFETENSORS_CORPUS = tests/fuzz/corpus/safetensors

fuzz-safetensors: fuzz-parser-build
	mkdir -p build-libfuzzer/safetensors-corpus build-libfuzzer/safetensors-findings
	cd build-libfuzzer && OMP_NUM_THREADS=1 ./safetensors_fuzzer safetensors-corpus \
	  ../$(SAFETENSORS_CORPUS) ../tests/fixtures/safetensors -dict=../tests/fuzz/safetensors.dict \
	  -max_total_time=$(FUZZ_TIME) -jobs=1 -workers=1 -artifact_prefix=safetensors-findings/ \
	  -print_final_stats=1 $(FUZZ_FLAGS)
	@grep -E '^(#[0-9]+.*DONE|stat::)' build-libfuzzer/fuzz-0.log || tail -n 20 build-libfuzzer/fuzz-0.log
	@if [ -n "$$(ls build-libfuzzer/safetensors-findings)" ]; then \
	  echo "findings: $$(ls build-libfuzzer/safetensors-findings)"; exit 1; fi

fuzz-safetensors-merge: fuzz-parser-build
	OMP_NUM_THREADS=1 build-libfuzzer/safetensors_fuzzer -merge=1 $(SAFETENSORS_CORPUS) \
	  build-libfuzzer/safetensors-corpus

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR)
