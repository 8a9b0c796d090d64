import random, sys
random.seed(1)
concat = sys.argv[1] == "concat"
eps = int(sys.argv[2])
out = ["table ip t {"]
for m in range(1000):
    key = "numgen random mod 1 . meta l4proto" if concat else "numgen random mod 1"
    out.append(f" map dm-{m} {{ typeof {key} : ip daddr . tcp dport; flags interval; }}")
out.append("}")
# weights 1..eps like Synthetic
tot = sum(range(1, eps+1))
for m in range(1000):
    K = random.randrange(0, 4000) * 1000000
    lo = 0; els = []
    for j in range(eps):
        w = j+1
        n = round(1000000 * w / tot) if j < eps-1 else 1000000 - lo
        hi = lo + n - 1
        k = m*eps+j
        a = f"198.19.{(k>>8)&255}.{k&255}"
        r = f"{K+lo}-{K+hi}"
        els.append(f"{r} . tcp : {a} . 8080" if concat else f"{r} : {a} . 8080")
        lo = hi + 1
    out.append(f"add element ip t dm-{m} {{ " + ", ".join(els) + " }")
print("\n".join(out))
