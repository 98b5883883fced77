# cmake -DCMD="prog|arg|..." -DREGEX=... -P expect_failure.cmake
# Passes when CMD exits non-zero and its output matches REGEX: for tests of aborts.
string(REPLACE "|" ";" cmd "${CMD}")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 50)
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "exit ${rc}, but the output does not match: ${REGEX}")
endif()
message("ok: exit ${rc} and the output matches")
