# Runs CMD (a ;-list) and requires a non-zero exit status, output matching EXPECT (a regex) and no
# crash or stack of foreign lines before it: bad input to the CLI is a clear error, not a success
# and not an uncaught exception (issue 27).
execute_process(COMMAND ${CMD} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a failure, got exit status 0:\n${all}")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the command did not exit normally (${rc}):\n${all}")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}':\n${all}")
endif()
if(all MATCHES "terminate called|std::bad_alloc|stoi|stoll|is not a recognized processor")
  message(FATAL_ERROR "an internal message reached the user:\n${all}")
endif()
message(STATUS "exit ${rc}, as expected: ${all}")
