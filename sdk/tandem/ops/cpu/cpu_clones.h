// TANDEM_CPU_CLONES: builds a function three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2,
// FMA) and the baseline, the dynamic loader picking one per process through an ifunc resolver
// (GCC's and Clang's target_clones). Only for loops that give the same bits either way (no
// multiply-add contraction in their files). Empty off x86-64, and
// under ThreadSanitizer, whose runtime is not up yet when the loader runs the resolvers.
#pragma once

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TANDEM_CPU_CLONES_OFF 1
#endif
#endif
#ifndef TANDEM_CPU_CLONES_OFF
#define TANDEM_CPU_CLONES [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#endif
#endif

#ifndef TANDEM_CPU_CLONES
#define TANDEM_CPU_CLONES
#endif
