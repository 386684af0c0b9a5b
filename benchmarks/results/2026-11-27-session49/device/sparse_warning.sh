for expr in "torch.sparse_coo_tensor(i, v, (3,), check_invariants=True)" "torch.sparse_coo_tensor(i, v, (3,), check_invariants=False)" "torch.sparse_coo_tensor(i, v, (3,))" "torch.ones(3).to_sparse()" "torch.sparse_coo_tensor(i, v, (3,), check_invariants=True, is_coalesced=False)"; do
python3 -W error -c "
import torch
i = torch.tensor([[0, 1]]); v = torch.tensor([1.0, 2.0])
try:
    $expr; print('no warning:', '''$expr''')
except Exception as e:
    print('WARNS:', '''$expr''', type(e).__name__)
"
done
python3 -W error -c "
import torch
i = torch.tensor([[0, 1]]); v = torch.tensor([1.0, 2.0])
with torch.sparse.check_sparse_tensor_invariants(enable=True):
    torch.sparse_coo_tensor(i, v, (3,))
print('context enable=True: no warning, then enabled?', torch.sparse.check_sparse_tensor_invariants.is_enabled())
torch.sparse_coo_tensor(i, v, (3,), check_invariants=True); print('after the context: explicit True no warning')
"
