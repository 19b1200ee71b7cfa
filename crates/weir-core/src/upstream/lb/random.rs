//! Weighted random: each available member with probability weight / total weight.

use super::rng::XorShift;
use super::Candidates;

pub fn pick(rng: &mut XorShift, c: &impl Candidates) -> Option<usize> {
    let n = c.len();
    // Weights are read once (each read is a few atomic loads): on the stack for pools of
    // up to 64 servers; larger pools read them twice.
    let mut buf = [0u32; 64];
    if let Some(cache) = buf.get_mut(..n) {
        for (i, w) in cache.iter_mut().enumerate() {
            *w = c.weight(i);
        }
        return walk(rng, cache.iter().copied());
    }
    walk(rng, (0..n).map(|i| c.weight(i)))
}

/// The member at a uniform point of the summed weights (`weights` is iterated twice).
fn walk(rng: &mut XorShift, weights: impl Iterator<Item = u32> + Clone) -> Option<usize> {
    let total: u64 = weights.clone().map(u64::from).sum();
    if total == 0 {
        return None;
    }
    let mut r = rng.below(total);
    for (i, w) in weights.enumerate() {
        let w = u64::from(w);
        if r < w {
            return Some(i);
        }
        r -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::lb::Fixed;

    #[test]
    fn weights_one_two_three_within_two_percent() {
        let mut rng = XorShift::new(42);
        let c = Fixed::new(&[1, 2, 3]);
        let mut counts = [0u32; 3];
        for _ in 0..6000 {
            counts[pick(&mut rng, &c).unwrap()] += 1;
        }
        for (i, expected) in [1000u32, 2000, 3000].into_iter().enumerate() {
            let share = f64::from(counts[i]) / 6000.0;
            let off = (share - f64::from(expected) / 6000.0).abs();
            assert!(off < 0.02, "{counts:?}");
        }
    }

    #[test]
    fn unavailable_members_are_never_picked() {
        let mut rng = XorShift::new(7);
        let c = Fixed::new(&[1, 0, 1]);
        for _ in 0..1000 {
            assert_ne!(pick(&mut rng, &c), Some(1));
        }
        assert_eq!(pick(&mut rng, &Fixed::new(&[0, 0])), None);
    }
}
