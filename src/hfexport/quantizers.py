"""`hfexport.quantizers`: another name for `hfexport.quantization` (the name other exporters use).

`from hfexport.quantizers import NNCFQuantizer` and `import hfexport.quantizers as q` give the
same objects as `hfexport.quantization`.
"""

import sys

from . import quantization as _quantization

sys.modules[__name__] = _quantization
