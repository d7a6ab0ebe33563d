"""Compatibility module: the names ``dspark_compile.ascend`` had before the split.

The torchair compile route is ``dspark_compile.routes.torchair``, GE
convertibility ``dspark_compile.routes.ge_converters`` and ``check_ascend``
``dspark_compile.tools.ascend_check`` (see CHANGELOG.md).
"""

from dspark_compile.routes.ge_converters import (  # noqa: F401
    ge_convertible_ops, is_ge_convertible, op_name, unconvertible_ops)
from dspark_compile.routes.torchair import (  # noqa: F401
    TORCHAIR_MODES, compile_with_torchair, on_npu)
from dspark_compile.tools.ascend_check import AscendCheck, GraphLike, check_ascend  # noqa: F401
from dspark_compile.tools.post_pass_graphs import trace_post_pass_graphs  # noqa: F401
