//! The benchmark's work counter (`kernels::work`), which its figures divide by: attention counts each cached key
//! and value row it reads once per call however many queries share it, beside its multiply-adds. One test in its
//! own binary, since the counter is global to the process.

use kvproof_engines::kernels::{attend, attend_many, work};

#[test]
fn attention_counts_its_pairs_and_each_cached_row_once() {
    let width = 16;
    let rows: Vec<Vec<f32>> = (0..10).map(|j| (0..width).map(|i| (i * j) as f32 * 0.01).collect()).collect();
    let kv = |j: usize| (rows[j].as_slice(), rows[j].as_slice());
    let q = vec![0.5f32; width];

    // three queries over keys 0..10, 2..10 and 5..10: ten rows read once each for keys and once for values
    let before = work();
    let mut out = vec![0.0; 3 * width];
    attend_many(&[&q, &q, &q], &[0..10, 2..10, 5..10], kv, 0.25, &mut out);
    let w = work().since(before);
    let pairs = 10 + 8 + 5;
    assert_eq!(w.flops, (2 * 2 * pairs * width) as u64, "scores and weighted sums, a multiply-add each");
    assert_eq!(w.cache_bytes, (2 * 10 * width * 4) as u64, "ten key rows and ten value rows, each once");
    assert_eq!(w.weight_bytes, 0);

    // one query over seven rows
    let before = work();
    attend(&q, (3..10).map(kv), 0.25, &mut Vec::new(), &mut out[..width]);
    let w = work().since(before);
    assert_eq!(w.cache_bytes, (2 * 7 * width * 4) as u64);
    assert_eq!(w.flops, (2 * 2 * 7 * width) as u64);
}
