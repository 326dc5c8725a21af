/*
 * torch_sort.c - the order torch.sort(descending=True) leaves a float32 row
 * in on the CPU, equal values included.
 *
 * SGLang's EPLB sorts pack items with torch.sort, which is not stable: on
 * the CPU it is std::sort over (value, index) pairs compared by value
 * alone, and libstdc++'s std::sort is an introsort (median-of-three
 * quicksort down to runs of 16, a heapsort below a depth of 2 floor(log2 n),
 * then one insertion sort). Which of two equal values comes first is
 * therefore a fixed function of the row, and it decides which expert (or
 * which replica of one) a pack takes first. epx's own order is stable
 * (deepseek.c); with --sglang-version the planner takes this one, so it
 * places as the release does when loads tie too. Each step below is the
 * libstdc++ routine of the same name, on indices, with the comparison
 * "w[a] > w[b]" (loads are finite and >= 0, so torch's NaN rule never
 * applies). Checked against torch.sort through the goldens (tools/
 * sglang_eplb.py: cases full of ties, rows up to 128 long) and, once,
 * against libstdc++'s std::sort and std::partial_sort (the heapsort, which
 * real loads hardly reach) on 2000 tie-heavy rows.
 */
#include "plan_internal.h"

#define THRESHOLD 16 /* libstdc++'s _S_threshold */

typedef struct {
    const float *w;
    int32_t *a;
} run;

static inline bool before(const run *r, int32_t x, int32_t y) { return r->w[x] > r->w[y]; }

static inline void swap_at(int32_t *a, int32_t i, int32_t j) {
    const int32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* ---- heap (the depth limit's fallback) ---------------------------------- */

static void push_heap(const run *r, int32_t first, int32_t hole, int32_t top, int32_t value) {
    int32_t *a = r->a;
    int32_t parent = (hole - 1) / 2;
    while (hole > top && before(r, a[first + parent], value)) {
        a[first + hole] = a[first + parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    a[first + hole] = value;
}

static void adjust_heap(const run *r, int32_t first, int32_t hole, int32_t len, int32_t value) {
    int32_t *a = r->a;
    const int32_t top = hole;
    int32_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (before(r, a[first + child], a[first + child - 1])) child--;
        a[first + hole] = a[first + child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        a[first + hole] = a[first + child - 1];
        hole = child - 1;
    }
    push_heap(r, first, hole, top, value);
}

/* __partial_sort(first, last, last): make_heap, then sort_heap. */
static void heap_sort(const run *r, int32_t first, int32_t last) {
    int32_t *a = r->a;
    const int32_t len = last - first;
    if (len >= 2)
        for (int32_t parent = (len - 2) / 2;; parent--) {
            adjust_heap(r, first, parent, len, a[first + parent]);
            if (parent == 0) break;
        }
    while (last - first > 1) {
        last--;
        const int32_t value = a[last];
        a[last] = a[first];
        adjust_heap(r, first, 0, last - first, value);
    }
}

/* ---- introsort ------------------------------------------------------------ */

static void move_median_to_first(const run *r, int32_t result, int32_t x, int32_t y, int32_t z) {
    int32_t *a = r->a;
    if (before(r, a[x], a[y])) {
        if (before(r, a[y], a[z]))
            swap_at(a, result, y);
        else if (before(r, a[x], a[z]))
            swap_at(a, result, z);
        else
            swap_at(a, result, x);
    } else if (before(r, a[x], a[z]))
        swap_at(a, result, x);
    else if (before(r, a[y], a[z]))
        swap_at(a, result, z);
    else
        swap_at(a, result, y);
}

static int32_t unguarded_partition(const run *r, int32_t first, int32_t last, int32_t pivot) {
    int32_t *a = r->a;
    for (;;) {
        while (before(r, a[first], a[pivot])) first++;
        last--;
        while (before(r, a[pivot], a[last])) last--;
        if (!(first < last)) return first;
        swap_at(a, first, last);
        first++;
    }
}

static void introsort_loop(const run *r, int32_t first, int32_t last, int32_t depth) {
    while (last - first > THRESHOLD) {
        if (depth == 0) {
            heap_sort(r, first, last);
            return;
        }
        depth--;
        move_median_to_first(r, first, first + 1, first + (last - first) / 2, last - 1);
        const int32_t cut = unguarded_partition(r, first + 1, last, first);
        introsort_loop(r, cut, last, depth);
        last = cut;
    }
}

static void unguarded_linear_insert(const run *r, int32_t last) {
    int32_t *a = r->a;
    const int32_t value = a[last];
    int32_t next = last - 1;
    while (before(r, value, a[next])) {
        a[last] = a[next];
        last = next;
        next--;
    }
    a[last] = value;
}

static void insertion_sort(const run *r, int32_t first, int32_t last) {
    int32_t *a = r->a;
    for (int32_t i = first + 1; i < last; i++) {
        if (before(r, a[i], a[first])) {
            const int32_t value = a[i];
            for (int32_t j = i; j > first; j--) a[j] = a[j - 1];
            a[first] = value;
        } else {
            unguarded_linear_insert(r, i);
        }
    }
}

void epxi_sort_desc_torch(const float *w, int32_t n, int32_t *order) {
    for (int32_t i = 0; i < n; i++) order[i] = i;
    if (n < 2) return;
    const run r = {w, order};
    int32_t lg = 0; /* std::__lg(n): floor(log2 n) */
    while ((n >> (lg + 1)) != 0) lg++;
    introsort_loop(&r, 0, n, 2 * lg);
    if (n > THRESHOLD) {
        insertion_sort(&r, 0, THRESHOLD);
        for (int32_t i = THRESHOLD; i < n; i++) unguarded_linear_insert(&r, i);
    } else {
        insertion_sort(&r, 0, n);
    }
}
